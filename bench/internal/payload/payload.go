// Package payload makes the envelope payloads the benchmarks store: JSON
// documents like the audit events users put in their envelopes (the default:
// what most mailboxes hold, and what compression is for), or random bytes like
// an encrypted body (nothing to compress).
package payload

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
)

// Kind is what a payload holds.
type Kind string

const (
	JSON   Kind = "json"
	Random Kind = "random"
)

// Parse reads a -payload flag's value.
func Parse(s string) (Kind, error) {
	switch k := Kind(s); k {
	case JSON, Random:
		return k, nil
	}
	return "", fmt.Errorf("payload %q: want json or random", s)
}

// Make returns a payload of kind drawn from r: size bytes of Random, or a
// JSON document of size to size+60 bytes (at least its fixed fields, ~600).
func (k Kind) Make(r *rand.Rand, size int) []byte {
	if k == JSON {
		return auditJSON(r, size)
	}
	b := make([]byte, (size+7)/8*8)
	for j := 0; j < len(b); j += 8 {
		binary.LittleEndian.PutUint64(b[j:], r.Uint64())
	}
	return b[:size]
}

var (
	actions   = []string{"user.updated", "user.login", "role.assigned", "policy.changed", "record.read", "invoice.paid", "export.requested"}
	resources = []string{"account", "invoice", "policy", "report", "customer"}
	fields    = []string{"email", "display_name", "phone", "address.city", "address.postcode", "plan", "role", "locale", "timezone", "status"}
	agents    = []string{
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36",
		"acme-cli/2.14.1 (linux; amd64)",
		"okhttp/4.12.0",
	}
	methods = []string{"PATCH", "PUT", "POST", "GET", "DELETE"}
)

// auditJSON is an audit event as a service would log it: an actor, a
// resource, the request, and field changes appended until the document
// reaches size. Ids, addresses, numbers and values vary per event; keys,
// enumerations and user agents repeat, as they do in real traffic.
func auditJSON(r *rand.Rand, size int) []byte {
	hex := func(n int) string {
		const digits = "0123456789abcdef"
		b := make([]byte, n)
		for i := range b {
			b[i] = digits[r.IntN(16)]
		}
		return string(b)
	}
	user := fmt.Sprintf("user-%05d", r.IntN(10_000))
	resource := resources[r.IntN(len(resources))]
	resID := resource[:3] + "_" + hex(12)
	b := make([]byte, 0, size+160)
	b = fmt.Appendf(b, `{"event_id":"evt_%s","occurred_at":"2026-11-%02dT%02d:%02d:%02d.%03dZ","action":%q,`,
		hex(20), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000), actions[r.IntN(len(actions))])
	b = fmt.Appendf(b, `"actor":{"id":%q,"email":"%s@example.com","ip":"10.%d.%d.%d","user_agent":%q,"session_id":"ses_%s"},`,
		user, user, r.IntN(256), r.IntN(256), r.IntN(256), agents[r.IntN(len(agents))], hex(16))
	b = fmt.Appendf(b, `"resource":{"type":%q,"id":%q,"tenant":"acme"},`, resource, resID)
	b = fmt.Appendf(b, `"request":{"method":%q,"path":"/v1/%ss/%s","status":%d,"latency_ms":%d},"changes":[`,
		methods[r.IntN(len(methods))], resource, resID, []int{200, 200, 200, 201, 204, 403, 404, 409}[r.IntN(8)], 1+r.IntN(900))
	for i := 0; len(b) < size-2 || i == 0; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"field":%q,"old":"%s","new":"%s"}`, fields[r.IntN(len(fields))], hex(4+r.IntN(12)), hex(4+r.IntN(12)))
	}
	return append(b, "]}"...)
}

// String and Set make a Kind a flag.Value.
func (k Kind) String() string { return string(k) }

func (k *Kind) Set(s string) error {
	v, err := Parse(s)
	if err == nil {
		*k = v
	}
	return err
}
