// Package movesbench measures moves by handoff (docs/architecture.md#moves) on real `prism` processes, as tests/moves runs them:
// three admin nodes, runners with their sidecars and a gateway on loopback, Kafka in process (kfake). Its figures
// are benchmarks (moves_test.go), run once each by bench/moves.sh, which prints BENCH <name> <value> <unit> lines:
//
//	moves.failed_queries_rolling_restart  queries that failed while three runners restart in the kubelet's order
//	moves.switch_pause_p99_ms             the longest gap between two successful answers of a namespace during
//	                                      its handoff, p99 over the handoffs of that restart
//	moves.catchup_s_<n>                   a namespace with n events moved by hand to a runner with peer recovery
//	                                      off, so its mailbox reads Kafka: the move's start to its switch
//	moves.recovery_s_<n>                  the same move to a runner that copies the source's mailbox (peer
//	                                      recovery) and then reads Kafka from the copied positions
//	moves.drain_s_100ns                   a proxy serving 100 namespaces cordoned until it serves none
//
// The package has no code outside its tests: its world is testkit/movetest's (tests/moves runs in it too), which
// takes a testing.TB.
package movesbench
