package security

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestRotationKeepsLeases replaces every certificate of a running mesh on disk, then its CA in three
// steps (trust both, reissue every certificate from the new CA, trust only the new one), without
// restarting anything: new connections present the new certificates, a restarted admin node rejoins
// over the rotated raft transport, a client of the old CA is refused at the end, and the sidecar keeps
// the one lease it held from the start.
func TestRotationKeepsLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, a runner and a sidecar")
	}
	p, err := e2e.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kafka := kafkatest.Start(t, kafkatest.Topics(2, topic))
	kafka.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, 5)...)
	admins := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, PKI: p})
	admins.CreateNamespace(60*time.Second, namespace, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
	runner := e2e.StartRunner(t, e2e.RunnerOptions{ProxyID: proxyID, Brokers: kafka.Brokers, PKI: p, Args: []string{"--batch-wait", "20ms", "--log-format", "json"}})
	sidecar := e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: runner, Admins: admins.GRPCAddrs(), Lease: lease})
	testwait.For(t, 60*time.Second, "sidecar ready", sidecar.Ready)
	held := leaseEpoch(t, admins)

	// Every identity the mesh's processes and the harness's clients run with.
	ids := []identity.Identity{{Role: identity.Proxy, Name: proxyID}, {Role: identity.Operator, Name: e2e.Operator}}
	for _, n := range admins.Nodes {
		ids = append(ids, identity.Identity{Role: identity.Admin, Name: n.ID})
	}
	// A client that keeps the operator certificate of the old CA (a pki.Source would follow the files).
	oldOperator := pkitest.Presented(t, e2e.Certs(t, p, identity.Operator, e2e.Operator))
	oldCA := p.CA()
	if _, err := serverSerial(admins.Nodes[0].GRPCAddr, oldOperator); err != nil {
		t.Fatalf("before the rotation the operator's certificate is refused: %v", err)
	}

	// 1. New certificates from the same CA: the next connection to each admin node presents its new one.
	reissue(t, p, oldCA, ids)
	for _, n := range admins.Nodes {
		want := serialOf(t, e2e.Certs(t, p, identity.Admin, n.ID).Cert)
		testwait.For(t, 10*time.Second, n.ID+" presenting its new certificate", func() (bool, string) {
			got, err := serverSerial(n.GRPCAddr, e2e.ClientTLS(t, p, identity.Operator, e2e.Operator))
			return err == nil && got.Cmp(want) == 0, fmt.Sprint(got, " ", err)
		})
	}

	// 2. CA rotation: trust both, reissue from the new CA, trust only the new one.
	newCA, err := pki.NewCA(e2e.TrustDomain, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(oldCA.CertPEM(), newCA.CertPEM()...)
	writeBundles(t, p, ids, bundle)
	reissue(t, p, newCA, ids)
	// A follower restarted now dials and is dialled with certificates of the new CA while its peers
	// still trust both: it must rejoin.
	lead := admins.AwaitLeader()
	f := admins.Follower(lead)
	admins.Nodes[f].Kill()
	admins.Nodes[f].Restart()
	writeBundles(t, p, ids, newCA.CertPEM())

	testwait.For(t, 30*time.Second, "the restarted node caught up over the rotated transport", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := admins.Nodes[f].Status(ctx)
		return err == nil && st.GetLeaderId() != "" && st.GetAppliedIndex() > 0, fmt.Sprint(st, err)
	})
	for _, n := range admins.Nodes {
		if _, err := serverSerial(n.GRPCAddr, oldOperator); err == nil {
			t.Errorf("%s still admits a client of the old CA after the rotation", n.ID)
		}
		if _, err := serverSerial(n.GRPCAddr, e2e.ClientTLS(t, p, identity.Operator, e2e.Operator)); err != nil {
			t.Errorf("%s refuses a client of the new CA: %v", n.ID, err)
		}
	}
	// A write still commits (raft among the rotated nodes), through a fresh connection of the new CA.
	cc, err := grpc.NewClient(admins.Nodes[f].GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(e2e.ClientTLS(t, p, identity.Operator, e2e.Operator))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	testwait.For(t, 30*time.Second, "a namespace created after the rotation", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := adminv1.NewControlPlaneClient(cc).CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "after-rotation", Config: &adminv1.NamespaceConfig{Topics: []string{topic}}})
		return err == nil, fmt.Sprint(err)
	})

	if got := leaseEpoch(t, admins); got != held {
		t.Errorf("lease epoch %d after the rotation, %d before: the sidecar lost its lease", got, held)
	}
	if v, err := e2e.NewHTTP(5*time.Second).Metric(sidecar.HTTPURL(), "prism_sidecar_lease_losses_total"); err == nil && v != 0 {
		t.Errorf("the sidecar lost its lease %v times during the rotation", v)
	}
}

// reissue replaces the certificate and key of every identity in p with new ones from ca, key first:
// a reader that sees the new key beside the old certificate keeps the old pair until both match.
func reissue(t *testing.T, p *e2e.PKI, ca *pki.CA, ids []identity.Identity) {
	t.Helper()
	for _, id := range ids {
		f := e2e.Certs(t, p, id.Role, id.Name)
		certPEM, keyPEM, err := ca.Issue(pki.Request{Role: id.Role, Name: id.Name, Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			t.Fatal(err)
		}
		replace(t, f.Key, keyPEM)
		replace(t, f.Cert, certPEM)
	}
}

func writeBundles(t *testing.T, p *e2e.PKI, ids []identity.Identity, bundle []byte) {
	t.Helper()
	for _, id := range ids {
		replace(t, e2e.Certs(t, p, id.Role, id.Name).CA, bundle)
	}
}

// replace writes path in one rename, as cert-manager and kubelet do.
func replace(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func serialOf(t *testing.T, certFile string) *big.Int {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, strings.TrimSuffix(certFile, ".pem")+"-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.SerialNumber
}

// serverSerial completes a handshake with addr as cfg and returns the serial of the certificate the
// server presented; an error when the handshake (or the server's first read of it) fails.
func serverSerial(addr string, cfg *tls.Config) (*big.Int, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"} // grpc-go closes a connection that did not negotiate HTTP/2
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// TLS 1.3 reports a refused client certificate on the first read; gRPC servers wait for the client's
	// preface, so a read timeout means the server kept the connection.
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func isTimeout(err error) bool {
	te, ok := err.(interface{ Timeout() bool })
	return ok && te.Timeout()
}

// leaseEpoch is the epoch of the mailbox's lease, read linearizably.
func leaseEpoch(t *testing.T, admins *e2e.AdminCluster) uint64 {
	t.Helper()
	var epoch uint64
	testwait.For(t, 20*time.Second, "the mailbox's lease", func() (bool, string) {
		n := e2e.Leader(admins.Nodes...)
		if n == nil {
			return false, "no leader"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ls, err := n.Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
		if err != nil {
			return false, err.Error()
		}
		for _, l := range ls.GetLeases() {
			if l.GetMailboxId() == mailboxID {
				epoch = l.GetEpoch()
				return true, ""
			}
		}
		return false, "no lease"
	})
	return epoch
}
