package kafkasec

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, args ...string) *Flags {
	t.Helper()
	var k Flags
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	k.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &k
}

// TestFlagsSecurity: the flags and the password environment variable
// give the connection they describe, and contradictions or missing
// credentials are refused.
func TestFlagsSecurity(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string // PRISM_KAFKA_SASL_PASSWORD
		want    Security
		wantErr string
	}{
		{name: "plaintext"},
		{name: "tls", args: []string{"--kafka-tls"}, want: Security{TLS: &TLS{}}},
		{name: "a tls file implies tls", args: []string{"--kafka-tls-ca=ca.pem", "--kafka-tls-server-name=kafka"},
			want: Security{TLS: &TLS{CAFile: "ca.pem", ServerName: "kafka"}}},
		{name: "scram, password from a file", args: []string{"--kafka-tls", "--kafka-sasl-mechanism=scram-sha-512", "--kafka-sasl-user=runner", "--kafka-sasl-password-file=" + pwFile},
			want: Security{TLS: &TLS{}, SASL: &SASL{Mechanism: SASLScramSHA512, User: "runner", Password: "from-file"}}},
		{name: "scram, password from the environment", args: []string{"--kafka-sasl-mechanism=SCRAM-SHA-256", "--kafka-sasl-user=runner"}, env: "from-env",
			want: Security{SASL: &SASL{Mechanism: SASLScramSHA256, User: "runner", Password: "from-env"}}},
		{name: "both password sources", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=runner", "--kafka-sasl-password-file=" + pwFile}, env: "from-env",
			wantErr: "exclude each other"},
		{name: "no password", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=runner"}, wantErr: "a password"},
		{name: "no user", args: []string{"--kafka-sasl-mechanism=PLAIN"}, env: "pw", wantErr: "--kafka-sasl-user"},
		{name: "missing password file", args: []string{"--kafka-sasl-mechanism=PLAIN", "--kafka-sasl-user=u", "--kafka-sasl-password-file=/nonexistent"},
			wantErr: "--kafka-sasl-password-file"},
		{name: "credentials without a mechanism", args: []string{"--kafka-sasl-user=runner"}, wantErr: "need --kafka-sasl-mechanism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvSASLPassword, tc.env)
			sec, err := parseFlags(t, tc.args...).Security()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("security() = %+v, %v; want an error saying %q", sec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sec, tc.want) {
				t.Fatalf("security() = %+v %+v, want %+v %+v", sec.TLS, sec.SASL, tc.want.TLS, tc.want.SASL)
			}
		})
	}
}
