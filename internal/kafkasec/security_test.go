package kafkasec

import (
	"strings"
	"testing"

	"github.com/IBM/sarama"
)

// TestSecurityApply: configurations that cannot work are refused before any
// connection, and a valid one sets the client the way sarama expects.
func TestSecurityApply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sec  Security
		want string // "" = accepted
	}{
		{"plaintext", Security{}, ""},
		{"scram without tls", Security{SASL: &SASL{Mechanism: SASLScramSHA512, User: "u", Password: "p"}}, ""},
		{"plain without tls", Security{SASL: &SASL{Mechanism: SASLPlain, User: "u", Password: "p"}}, "in clear"},
		{"unknown mechanism", Security{SASL: &SASL{Mechanism: "GSSAPI", User: "u", Password: "p"}}, "GSSAPI"},
		{"no password", Security{SASL: &SASL{Mechanism: SASLScramSHA256, User: "u"}}, "password"},
		{"missing ca file", Security{TLS: &TLS{CAFile: "/nonexistent/ca.pem"}}, "kafka tls ca"},
		{"cert without key", Security{TLS: &TLS{CertFile: "c.pem"}}, "cert and key"},
		{"missing client certificate", Security{TLS: &TLS{CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/k.pem"}}, "client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := sarama.NewConfig()
			err := tc.sec.Apply(sc)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Apply = %v, want an error saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.Validate(); err != nil {
				t.Fatalf("sarama refuses the applied config: %v", err)
			}
			if sc.Net.TLS.Enable != (tc.sec.TLS != nil) || sc.Net.SASL.Enable != (tc.sec.SASL != nil) {
				t.Fatalf("tls %v sasl %v, want %v %v", sc.Net.TLS.Enable, sc.Net.SASL.Enable, tc.sec.TLS != nil, tc.sec.SASL != nil)
			}
		})
	}
}
