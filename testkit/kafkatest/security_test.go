package kafkatest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
)

// TestSecureClusters: the helpers produce and read back through every secured kind of cluster, and the
// cluster really is secured: a client without the credentials it requires gets nothing.
func TestSecureClusters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []Option
		// unauthorized are the options of a client missing one of the cluster's requirements.
		unauthorized func(c *Cluster) []kgo.Opt
	}{
		{"tls", []Option{TLS()}, func(*Cluster) []kgo.Opt { return nil }},
		{"mtls", []Option{MutualTLS()}, func(c *Cluster) []kgo.Opt {
			return []kgo.Opt{kgo.DialTLSConfig(&tls.Config{RootCAs: caPool(t, c.TLS.CA)})}
		}},
		{"sasl scram-sha-256", []Option{SASL(ScramSHA256, "runner", "s3cret")}, func(*Cluster) []kgo.Opt { return nil }},
		{"sasl scram-sha-512 over tls", []Option{TLS(), SASL(ScramSHA512, "runner", "s3cret")}, func(c *Cluster) []kgo.Opt {
			return []kgo.Opt{kgo.DialTLSConfig(&tls.Config{RootCAs: caPool(t, c.TLS.CA)})}
		}},
		{"sasl plain, wrong password", []Option{SASL(Plain, "runner", "s3cret")}, func(*Cluster) []kgo.Opt {
			return []kgo.Opt{kgo.SASL(plain.Auth{User: "runner", Pass: "guess"}.AsMechanism())}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Start(t, append([]Option{Topics(1, "t")}, tc.opts...)...)
			c.Produce(t, &kgo.Record{Topic: "t", Value: []byte("v")})
			if got := c.ReadAll(t, "t", 1); len(got) != 1 || string(got[0].Value) != "v" {
				t.Fatalf("read back %v, want the one record", got)
			}

			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.DialTimeout(2 * time.Second)},
				tc.unauthorized(c)...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := cl.Ping(ctx); err == nil {
				t.Fatal("a client without the cluster's credentials reached the broker")
			}
		})
	}
}

func caPool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("no certificate in %s", file)
	}
	return p
}
