// Package testkit is the floor the test kits live on: the packages that tests,
// the suites under tests/ and the benchmarks under bench/ import to start real
// parts of the mesh and to observe them. Nothing in the production tree imports
// them (TestProductionImportsNoTestKit), so a kit may import any production
// package it needs and a production binary never links a kit.
//
//   - e2e, testproc, testbin: real `prism` processes on loopback, built once per test process
//   - kafkatest: an in-process Kafka (kfake) broker; pkitest: a throwaway CA
//   - movetest: the world tests/moves and bench/movesbench run moves in
//   - xdstest: the xDS pipeline in-process; authtest: an identity provider
//   - openapitest: recorded exchanges with the query API; conntest: connection bounds checks
//   - faultproxy, slowfs, podproc: faults (cut or blackholed TCP, a stalling disk) and pods on one host
//   - testwait: await a condition instead of sleeping; loadgen: closed- and open-loop callers
package testkit
