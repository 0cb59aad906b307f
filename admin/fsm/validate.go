package fsm

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Lease timing defaults and bounds. Defaults apply when neither the request
// nor the namespace config sets a value; they favour quick failover (a dead
// runner's route goes away within ttl + grace = 15 s) over tolerance of long
// admin outages.
const (
	DefaultLeaseTTL          = 10 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultLeaseGrace        = 5 * time.Second
	MinLeaseTTL              = time.Second
	MaxLeaseTTL              = time.Hour
	MaxLeaseGrace            = time.Hour
	// MaxTopics, MaxLabels and MaxListLen (addresses, capabilities) keep
	// one record from bloating every snapshot.
	MaxTopics  = 64
	MaxLabels  = 64
	MaxListLen = 64
)

var (
	// ErrUnknownCommand: the command has no body this version handles.
	ErrUnknownCommand = errors.New("unknown command type")
	// ErrInvalid: a field is malformed (gRPC InvalidArgument). It is the
	// sentinel of mesh's id rules, so one errors.Is covers the id checks and
	// the FSM's own.
	ErrInvalid = mesh.ErrInvalid
	// ErrProxyNotFound: the proxy never registered (gRPC NotFound).
	ErrProxyNotFound = errors.New("proxy not registered")
	// ErrNamespaceExists: the namespace exists with a different config
	// (gRPC AlreadyExists).
	ErrNamespaceExists = errors.New("namespace exists with a different config")
	// ErrNotRegisteredInstance: a proxy's own call names a sidecar instance
	// other than the registered one (gRPC FailedPrecondition).
	ErrNotRegisteredInstance = errors.New("not the registered sidecar instance")
)

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// ValidateAddress checks a host:port with a numeric port in 1..65535.
func ValidateAddress(field, addr string) error {
	if err := mesh.ValidateID(field, addr); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return invalid(field, "%q: %v", addr, err)
	}
	if host == "" {
		return invalid(field, "%q has no host", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return invalid(field, "%q: port must be 1-65535", addr)
	}
	return nil
}

// duration checks an optional duration field: unset is zero, negative or
// malformed is an error.
func duration(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, "%v", err)
	}
	v := d.AsDuration()
	if v < 0 {
		return 0, invalid(field, "negative (%s)", v)
	}
	return v, nil
}

// ValidateTTL checks a lease ttl; zero means "the default".
func ValidateTTL(field string, d *durationpb.Duration) error {
	v, err := duration(field, d)
	if err != nil {
		return err
	}
	if v != 0 && (v < MinLeaseTTL || v > MaxLeaseTTL) {
		return invalid(field, "%s is outside [%s, %s]", v, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

func validateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid(field, "%d labels, at most %d", len(labels), MaxLabels)
	}
	// Sorted, so every replica reports the same offending key.
	for _, k := range sortedKeys(labels) {
		v := labels[k]
		if err := mesh.ValidateID(field+" key", k); err != nil {
			return err
		}
		if len(v) > mesh.MaxIDLen || !utf8.ValidString(v) {
			return invalid(field, "value of %q must be UTF-8 of at most %d bytes", k, mesh.MaxIDLen)
		}
	}
	return nil
}

// ValidateNamespaceConfig checks a namespace config as CreateNamespace
// receives it.
func ValidateNamespaceConfig(c *adminv1.NamespaceConfig) error {
	if c == nil {
		return invalid("config", "missing")
	}
	if len(c.GetTopics()) == 0 {
		return invalid("config.topics", "at least one topic is required")
	}
	if len(c.GetTopics()) > MaxTopics {
		return invalid("config.topics", "%d topics, at most %d", len(c.GetTopics()), MaxTopics)
	}
	for i, t := range c.GetTopics() {
		if err := mesh.ValidateID(fmt.Sprintf("config.topics[%d]", i), t); err != nil {
			return err
		}
	}
	if r := c.GetReplicas(); r > placement.MaxReplicas {
		return invalid("config.replicas", "%d copies, at most %d (each consumes the topics and stores the whole history)", r, placement.MaxReplicas)
	}
	if t := c.GetDeadLetterTopic(); t != "" {
		if err := mesh.ValidateID("config.dead_letter_topic", t); err != nil {
			return err
		}
	}
	if _, ok := adminv1.ValidationMode_name[int32(c.GetValidationMode())]; !ok {
		return invalid("config.validation_mode", "unknown value %d", c.GetValidationMode())
	}
	if err := ValidateTTL("config.lease.ttl", c.GetLease().GetTtl()); err != nil {
		return err
	}
	ttl, _ := duration("config.lease.ttl", c.GetLease().GetTtl())
	hb, err := duration("config.lease.heartbeat_interval", c.GetLease().GetHeartbeatInterval())
	if err != nil {
		return err
	}
	if hb != 0 && hb >= orDefault(ttl, DefaultLeaseTTL) {
		return invalid("config.lease.heartbeat_interval", "%s must be shorter than the ttl", hb)
	}
	grace, err := duration("config.lease.grace", c.GetLease().GetGrace())
	if err != nil {
		return err
	}
	if grace > MaxLeaseGrace {
		return invalid("config.lease.grace", "%s exceeds %s", grace, MaxLeaseGrace)
	}
	if _, err := duration("config.retention.max_age", c.GetRetention().GetMaxAge()); err != nil {
		return err
	}
	if c.GetRetention().GetMaxSizeBytes() < 0 {
		return invalid("config.retention.max_size_bytes", "negative")
	}
	return validateLabels("config.labels", c.GetLabels())
}

// admissions hold the name rules (mesh.NameRule, mesh.NamespaceRule) for
// the commands that introduce a name, keyed like handlers. They run when a
// command is proposed (Encode, ValidateBody), never when it is applied: the
// log and snapshots may hold names an older version admitted, which still
// load, apply and can be released or deleted by name. Commands that only
// refer to a name check it is well formed (mesh.ValidateNamespaceName and
// the like), so such names keep working until an operator replaces them.
var admissions = map[reflect.Type]func(*adminv1.Command) error{
	reflect.TypeFor[*adminv1.Command_CreateNamespace](): func(cmd *adminv1.Command) error {
		return mesh.CheckNamespace(cmd.GetCreateNamespace().GetNamespace())
	},
	reflect.TypeFor[*adminv1.Command_RegisterProxy](): func(cmd *adminv1.Command) error {
		r := cmd.GetRegisterProxy().GetRegistration()
		return runnerNames("registration.", r.GetProxyId(), r.GetRunnerId())
	},
	reflect.TypeFor[*adminv1.Command_OpenSession](): func(cmd *adminv1.Command) error {
		o := cmd.GetOpenSession()
		return runnerNames("", o.GetProxyId(), o.GetRunnerId())
	},
}

// runnerNames checks the ids xds/ir routes a proxy by; an empty runner id
// means the proxy id.
func runnerNames(prefix, proxyID, runnerID string) error {
	if err := mesh.CheckName(prefix+"proxy_id", proxyID); err != nil {
		return err
	}
	if runnerID == "" {
		return nil
	}
	return mesh.CheckName(prefix+"runner_id", runnerID)
}

// admit applies the name rules of cmd's type, if it has any.
func admit(cmd *adminv1.Command) error {
	if a := admissions[reflect.TypeOf(cmd.GetBody())]; a != nil {
		return a(cmd)
	}
	return nil
}

func orDefault(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}
