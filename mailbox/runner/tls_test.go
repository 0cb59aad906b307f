package runner

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// clientCases are the callers of a TLS runner's query port, and what each
// must get: refused at the connection, refused by role, or answered.
type clientCase struct {
	name string
	tls  *tls.Config
	want codes.Code // codes.Unavailable: the connection is refused
	http int        // 0: the request fails before any status
}

func clientCases(t *testing.T, p *pkitest.PKI) []clientCase {
	t.Helper()
	expired := p.Expired(identity.Gateway, "gw")
	client := func(role identity.Role, name string) *tls.Config {
		return p.Source(role, name).ClientConfig(pki.RoleIs(identity.Proxy))
	}
	return []clientCase{
		{"no client certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, codes.Unavailable, 0}, //nolint:gosec // the test is about the server's check
		{"certificate of another CA", pkitest.Presented(t, pkitest.New(t).Files(identity.Gateway, "gw")), codes.Unavailable, 0},
		{"expired certificate", pkitest.Presented(t, expired), codes.Unavailable, 0},
		{"proxy identity", client(identity.Proxy, "p2"), codes.PermissionDenied, http.StatusForbidden},
		{"the runner's own identity", client(identity.Proxy, "p1"), codes.PermissionDenied, http.StatusForbidden},
		{"admin identity", client(identity.Admin, "a1"), codes.PermissionDenied, http.StatusForbidden},
		{"gateway", client(identity.Gateway, "gw"), codes.OK, http.StatusOK},
		{"operator", client(identity.Operator, "ops"), codes.OK, http.StatusOK},
		{"reader", client(identity.Reader, "ro"), codes.OK, http.StatusOK},
	}
}

// startTLS serves a runner with the identity proxy/p1 hosting $a@p1 under
// epoch 7.
func startTLS(t *testing.T, p *pkitest.PKI) (queryAddr, httpAddr string) {
	t.Helper()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "a.events.dlq"))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, TLS: p.Source(identity.Proxy, "p1")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	queryAddr, httpAddr = serve(t, r)
	if err := r.Open(MailboxConfig{ID: "$a@p1", Topics: []string{"a.events"}, Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	return queryAddr, httpAddr
}

// TestTLSQueryPortGRPC: MailboxQuery over mutual TLS answers gateway,
// operator and reader identities only; health answers any identity of the
// trust domain; nobody else gets a connection.
func TestTLSQueryPortGRPC(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	queryAddr, _ := startTLS(t, p)
	for _, tc := range clientCases(t, p) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, err := grpc.NewClient(queryAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc.tls)))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, "$a@p1")
			resp, err := mailboxv1.NewMailboxQueryClient(cc).GetStats(ctx, &mailboxv1.GetStatsRequest{})
			if got := grpcstatus.Code(err); got != tc.want {
				t.Fatalf("GetStats = %v, want %v", err, tc.want)
			}
			if tc.want == codes.OK && (resp.GetStats().GetMailboxId() != "$a@p1" || resp.GetStats().GetEpoch() != 7) {
				t.Fatalf("GetStats = %v", resp)
			}
			if tc.want == codes.PermissionDenied && !strings.Contains(err.Error(), "may not make this call") {
				t.Fatalf("refusal %q does not say why", err)
			}
			// Health is open to every identity the handshake accepts.
			wantHealth := codes.OK
			if tc.want == codes.Unavailable {
				wantHealth = codes.Unavailable
			}
			_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if got := grpcstatus.Code(err); got != wantHealth {
				t.Fatalf("health Check = %v, want %v", err, wantHealth)
			}
		})
	}
}

// TestTLSQueryPortHTTP: the HTTP query API on the query port answers the
// same identities over h2 and HTTP/1.1 (ALPN), refuses the others with the
// API's JSON errors, and the plaintext HTTP port keeps only the probes.
func TestTLSQueryPortHTTP(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	queryAddr, httpAddr := startTLS(t, p)
	var h1, h2 http.Protocols
	h1.SetHTTP1(true)
	h2.SetHTTP2(true)
	for _, tc := range clientCases(t, p) {
		for _, proto := range []struct {
			name  string
			p     *http.Protocols
			major int
		}{{"HTTP/1.1", &h1, 1}, {"h2", &h2, 2}} {
			t.Run(tc.name+" "+proto.name, func(t *testing.T) {
				t.Parallel()
				client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc.tls.Clone(), Protocols: proto.p}}
				defer client.CloseIdleConnections()
				resp, err := client.Get("https://" + queryAddr + "/v1/mailboxes/%24a%40p1/stats")
				if tc.http == 0 {
					if err == nil {
						resp.Body.Close()
						t.Fatalf("answered %d", resp.StatusCode)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.http || resp.ProtoMajor != proto.major || resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("GET stats = %d over HTTP/%d (%s) %s, want %d over HTTP/%d as JSON", resp.StatusCode, resp.ProtoMajor, resp.Header.Get("Content-Type"), body, tc.http, proto.major)
				}
				var st struct {
					MailboxID string `json:"mailbox_id"`
					Epoch     uint64 `json:"epoch"`
					Error     string `json:"error"`
				}
				if err := json.Unmarshal(body, &st); err != nil {
					t.Fatalf("%s: %v", body, err)
				}
				switch tc.http {
				case http.StatusOK:
					if st.MailboxID != "$a@p1" || st.Epoch != 7 {
						t.Fatalf("stats %s", body)
					}
				case http.StatusForbidden:
					if !strings.Contains(st.Error, "may not make this call") || !strings.Contains(st.Error, "spiffe://") {
						t.Fatalf("403 %s does not name the caller and why", body)
					}
				}
			})
		}
	}

	t.Run("plaintext port keeps the probes, not the API", func(t *testing.T) {
		t.Parallel()
		for path, want := range map[string]int{
			"/healthz": http.StatusOK, "/readyz": http.StatusOK, "/metrics": http.StatusOK,
			"/v1/mailboxes/%24a%40p1/stats": http.StatusNotFound,
		} {
			got, hdr := status(t, "http://"+httpAddr+path)
			if got != want {
				t.Errorf("GET %s on the plaintext port = %d, want %d", path, got, want)
			}
			if want == http.StatusNotFound && hdr.Get("Content-Type") != "application/json" {
				t.Errorf("GET %s: %q, want the API's JSON refusal", path, hdr.Get("Content-Type"))
			}
		}
	})
}

// authorizeHTTP answers a request without a verified certificate (which
// the handshake never lets through, so called directly) with a JSON 401.
func TestAuthorizeHTTPWithoutCertificate(t *testing.T) {
	t.Parallel()
	called := false
	h := authorizeHTTP(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/mailboxes/a@p1/stats", nil))
	if called || w.Code != http.StatusUnauthorized || w.Header().Get("Content-Type") != "application/json" || !strings.Contains(w.Body.String(), "client certificate") {
		t.Fatalf("called %v, %d %q %s; want a JSON 401", called, w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
}
