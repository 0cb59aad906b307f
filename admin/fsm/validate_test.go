package fsm

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestValidateNamespaceConfig(t *testing.T) {
	t.Parallel()
	ok := func() *adminv1.NamespaceConfig { return createNS("n", "t").GetConfig() }
	cases := []struct {
		name  string
		edit  func(c *adminv1.NamespaceConfig)
		field string // expected in the error; "" means valid
	}{
		{"valid", func(*adminv1.NamespaceConfig) {}, ""},
		{"defaults only", func(c *adminv1.NamespaceConfig) { c.Lease, c.Retention = nil, nil }, ""},
		{"no topics", func(c *adminv1.NamespaceConfig) { c.Topics = nil }, "config.topics"},
		{"empty topic", func(c *adminv1.NamespaceConfig) { c.Topics = []string{"a", ""} }, "config.topics[1]"},
		{"too many topics", func(c *adminv1.NamespaceConfig) { c.Topics = make([]string, MaxTopics+1) }, "config.topics"},
		{"bad dead-letter topic", func(c *adminv1.NamespaceConfig) { c.DeadLetterTopic = "a b" }, "config.dead_letter_topic"},
		{"unknown validation mode", func(c *adminv1.NamespaceConfig) { c.ValidationMode = 42 }, "config.validation_mode"},
		{"ttl too short", func(c *adminv1.NamespaceConfig) { c.Lease.Ttl = durationpb.New(time.Millisecond) }, "config.lease.ttl"},
		{"negative ttl", func(c *adminv1.NamespaceConfig) { c.Lease.Ttl = durationpb.New(-time.Second) }, "config.lease.ttl"},
		{"malformed ttl", func(c *adminv1.NamespaceConfig) { c.Lease.Ttl = &durationpb.Duration{Seconds: 1, Nanos: -1} }, "config.lease.ttl"},
		{"heartbeat not under ttl", func(c *adminv1.NamespaceConfig) { c.Lease.HeartbeatInterval = c.Lease.Ttl }, "config.lease.heartbeat_interval"},
		{"heartbeat not under default ttl", func(c *adminv1.NamespaceConfig) {
			c.Lease = &adminv1.LeaseConfig{HeartbeatInterval: durationpb.New(DefaultLeaseTTL)}
		}, "config.lease.heartbeat_interval"},
		{"negative grace", func(c *adminv1.NamespaceConfig) { c.Lease.Grace = durationpb.New(-time.Second) }, "config.lease.grace"},
		{"huge grace", func(c *adminv1.NamespaceConfig) { c.Lease.Grace = durationpb.New(2 * MaxLeaseGrace) }, "config.lease.grace"},
		{"negative max_age", func(c *adminv1.NamespaceConfig) { c.Retention.MaxAge = durationpb.New(-time.Hour) }, "config.retention.max_age"},
		{"negative max size", func(c *adminv1.NamespaceConfig) { c.Retention.MaxSizeBytes = -1 }, "config.retention.max_size_bytes"},
		{"bad label key", func(c *adminv1.NamespaceConfig) { c.Labels = map[string]string{"ok": "1", "": "x"} }, "config.labels"},
		{"long label value", func(c *adminv1.NamespaceConfig) {
			c.Labels = map[string]string{"k": strings.Repeat("v", mesh.MaxIDLen+1)}
		}, "config.labels"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := ok()
			tc.edit(cfg)
			err := ValidateNamespaceConfig(cfg)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v, want ErrInvalid naming %s", err, tc.field)
			}
		})
	}
	if err := ValidateNamespaceConfig(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil config: %v", err)
	}
}

func TestValidateCommands(t *testing.T) {
	t.Parallel()
	reg := func(edit func(r *adminv1.ProxyRegistration)) *adminv1.Command {
		r := register("proxy-01")
		edit(r.Registration)
		return c(0, r)
	}
	cases := []struct {
		name  string
		cmd   *adminv1.Command
		field string
	}{
		{"registration ok", reg(func(*adminv1.ProxyRegistration) {}), ""},
		{"no registration", c(0, &adminv1.RegisterProxyRequest{}), "registration"},
		{"proxy id with @", reg(func(r *adminv1.ProxyRegistration) { r.ProxyId = "a@b" }), "proxy_id"},
		{"proxy id too long", reg(func(r *adminv1.ProxyRegistration) { r.ProxyId = strings.Repeat("p", mesh.MaxIDLen+1) }), "proxy_id"},
		{"proxy id not UTF-8", reg(func(r *adminv1.ProxyRegistration) { r.ProxyId = "p\xff" }), "proxy_id"},
		{"address port out of range", reg(func(r *adminv1.ProxyRegistration) { r.Address = "h:70000" }), "registration.address"},
		{"address without host", reg(func(r *adminv1.ProxyRegistration) { r.Address = ":80" }), "registration.address"},
		{"bad additional address", reg(func(r *adminv1.ProxyRegistration) { r.AdditionalAddresses = []string{"[::1]:80", "nope"} }), "registration.additional_addresses[1]"},
		{"too many capabilities", reg(func(r *adminv1.ProxyRegistration) { r.Capabilities = make([]string, MaxListLen+1) }), "registration.capabilities"},
		{"empty capability", reg(func(r *adminv1.ProxyRegistration) { r.Capabilities = []string{""} }), "registration.capabilities[0]"},
		{"bad zone", reg(func(r *adminv1.ProxyRegistration) { r.Zone = "eu west" }), "registration.zone"},
		{"bad label", reg(func(r *adminv1.ProxyRegistration) { r.Labels = map[string]string{"a b": "c"} }), "registration.labels"},
		{"health listed twice", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a"}, {Namespace: "a"}}}), "namespace_health"},
		{"health for a bad namespace", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a@b"}}}), "namespace"},
		{"recovery from a bad mailbox", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{SourceMailboxId: "a"}}}}), "namespace_health[0].recovery: source_mailbox_id"},
		{"recovery in an unknown state", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{State: 99}}}}), "recovery: invalid argument: state"},
		{"recovery with negative bytes", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{BytesCopied: -1}}}}), "bytes_copied"},
		{"recovery with a malformed time", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{HistoryStartsAt: &timestamppb.Timestamp{Nanos: -1}}}}}), "history_starts_at"},
		{"recovery with a long error", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{Error: strings.Repeat("x", maxOpenFailureLen+1)}}}}), "recovery: invalid argument: error"},
		{"a valid recovery", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", NamespaceHealth: []*adminv1.NamespaceHealth{{Namespace: "a", Recovery: &adminv1.RecoveryStatus{
			State: adminv1.RecoveryState_RECOVERY_STATE_COPIED, SourceMailboxId: "a@q", BytesCopied: 10, EventsCopied: 1, StartedAt: at(0), FinishedAt: at(time.Second), HistoryComplete: true}}}}), ""},
		{"heartbeat naming a bad runner", c(0, &adminv1.ProxyHeartbeatRequest{ProxyId: "p", RunnerId: "runner a"}), "runner_id"},
		{"stale mark without last_seen", c(0, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: "p"}}}), "proxies[0].last_seen"},
		{"stale mark bad id", c(0, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: "", LastSeen: at(0)}}}), "proxy_id"},
		{"create with bad requesting proxy", c(0, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: createNS("n", "t").GetConfig(), RequestingProxy: "a@b"}), "requesting_proxy"},
		{"create with bad principal", c(0, &adminv1.CreateNamespaceRequest{Namespace: "n", Config: createNS("n", "t").GetConfig(), Principal: "a\nb"}), "principal"},
		{"create without name", c(0, createNS("", "t")), "namespace"},
		{"delete without name", c(0, &adminv1.DeleteNamespaceRequest{}), "namespace"},
		{"release without runner", c(0, &adminv1.ReleaseLeaseRequest{MailboxId: "a@p"}), "runner_id"},
		{"acquire without runner", c(0, &adminv1.AcquireLeaseRequest{MailboxId: "a@p", RunnerAddress: "h:1"}), "runner_id"},
		{"malformed leader time", &adminv1.Command{Now: at(0), Body: &adminv1.Command_DeleteNamespace{DeleteNamespace: &adminv1.DeleteNamespaceRequest{Namespace: "n"}}}, ""},
	}
	cases[len(cases)-1].cmd.Now.Nanos = -1
	cases[len(cases)-1].field = "now"
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Validate(tc.cmd)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid command refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v, want ErrInvalid naming %s", err, tc.field)
			}
		})
	}
}

func TestCounts(t *testing.T) {
	t.Parallel()
	h, owner, _, _ := base(t)
	p, _ := h.f.Proxy(owner)
	h.must(c(time.Minute, &adminv1.MarkProxiesStaleCommand{Proxies: []*adminv1.ProxyRef{{ProxyId: owner, LastSeen: p.GetProxy().GetLastSeen()}}}))
	if got, want := h.f.Counts(), (Counts{Proxies: 2, LiveProxies: 1, Namespaces: 1, Leases: 1}); got != want {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
}

// TestNameRulesAdmission: a command introducing a name the routing layer
// cannot carry is refused when proposed, stating the rule; one an older
// version committed with such a name still applies, survives a snapshot
// (with a warning naming it) and can be deleted by name.
func TestNameRulesAdmission(t *testing.T) {
	t.Parallel()
	open := &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r", RunnerAddress: "r.svc:9090"}
	refused := []struct {
		name string
		cmd  *adminv1.Command
		rule string
	}{
		{"unicode namespace", c(0, createNS("uni☃", "t")), mesh.NamespaceRule},
		{"namespace with a colon", c(0, createNS("a:b", "t")), mesh.NamespaceRule},
		{"namespace with a slash", c(0, createNS("a/b", "t")), mesh.NamespaceRule},
		{"unicode proxy id", c(0, register("proxy☃")), mesh.NameRule},
		{"unicode runner id", c(0, registerRunner("p", "r☃")), mesh.NameRule},
		{"session of a bad runner", c(0, &adminv1.OpenSessionRequest{ProxyId: "p", RunnerId: "r%00", RunnerAddress: "r.svc:9090"}), mesh.NameRule},
	}
	for _, tc := range refused {
		if err := Validate(tc.cmd); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("%s: Validate = %v, want ErrInvalid stating %q", tc.name, err, tc.rule)
		}
		if err := ValidateBody(tc.cmd); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: ValidateBody = %v, want ErrInvalid", tc.name, err)
		}
		if _, err := Encode(tc.cmd); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Encode = %v, want ErrInvalid", tc.name, err)
		}
	}
	for _, cmd := range []*adminv1.Command{c(0, createNS("$admin", "t")), c(0, registerRunner("proxy-01.a_b~c", "Runner-1")), c(0, open)} {
		if _, err := Encode(cmd); err != nil {
			t.Errorf("%s refused: %v", CommandType(cmd), err)
		}
	}

	// What an older version committed: applied as it was, not refused by
	// the rules that now guard proposals.
	var logs bytes.Buffer
	h := newHarness(t)
	h.must(c(0, register("proxy-01")))
	h.must(c(0, createNS("uni☃", "t")))
	h.must(c(0, createNS("ok", "t")))
	g := New(WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err := g.Restore(io.NopCloser(bytes.NewReader(dump(t, h.f)))); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if ns, _, _ := g.Namespace("uni☃"); ns == nil {
		t.Fatal("the restored FSM lost namespace uni☃")
	}
	if out := logs.String(); !strings.Contains(out, "uni☃") || strings.Contains(out, "namespace=ok") {
		t.Fatalf("restore logged %q, want a warning naming uni☃ alone", out)
	}
	del, err := Encode(c(time.Second, &adminv1.DeleteNamespaceRequest{Namespace: "uni☃"}))
	if err != nil {
		t.Fatalf("delete of a stored namespace refused: %v", err)
	}
	h.applyBytes(del)
	if ns, _, _ := h.f.Namespace("uni☃"); ns != nil {
		t.Fatal("namespace uni☃ not deleted")
	}
}
