package mesh

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIDLen bounds every id; Kubernetes object names, our default proxy and
// runner ids, are at most 253 bytes.
const MaxIDLen = 253

// ErrInvalid is wrapped by every refusal of an id, with the field it names
// ("invalid argument: proxy_id: ..."); servers answer it InvalidArgument.
var ErrInvalid = errors.New("invalid argument")

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// ValidateID checks an identifier: non-empty, at most MaxIDLen bytes of
// UTF-8 with no whitespace or control characters. Errors name field.
func ValidateID(field, id string) error {
	return validateID(field, id, MaxIDLen)
}

// MaxMailboxIDLen is the longest mailbox id: a namespace and a proxy id of
// MaxIDLen bytes each, and the '@' between them.
const MaxMailboxIDLen = 2*MaxIDLen + 1

func validateID(field, id string, maxLen int) error {
	switch {
	case id == "":
		return invalid(field, "empty")
	case len(id) > maxLen:
		return invalid(field, "%d bytes, at most %d", len(id), maxLen)
	case !utf8.ValidString(id):
		return invalid(field, "not UTF-8")
	case strings.IndexFunc(id, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return invalid(field, "%q contains whitespace or control characters", id)
	}
	return nil
}

// ValidateProxyID checks that a proxy id is well formed; it may not contain
// '@', which separates it from the namespace in a mailbox id. It is what
// the Raft log and snapshots may already hold, from versions before
// NameRule: a new proxy id must also pass CheckName.
func ValidateProxyID(id string) error {
	if err := ValidateID("proxy_id", id); err != nil {
		return err
	}
	if strings.Contains(id, "@") {
		return invalid("proxy_id", "%q contains '@'", id)
	}
	return nil
}

// ValidateNamespaceName checks that a namespace name is well formed ('@' is
// not, so mailbox ids stay unambiguous). Like ValidateProxyID it admits
// the names older versions stored; a new namespace must pass
// CheckNamespace.
func ValidateNamespaceName(name string) error {
	if err := ValidateID("namespace", name); err != nil {
		return err
	}
	if strings.Contains(name, "@") {
		return invalid("namespace", "%q contains '@'", name)
	}
	return nil
}

// MailboxID names the mailbox of one namespace on one proxy; it is written
// "{namespace}@{proxy_id}". The zero value is not a valid id: make one with
// NewMailboxID or ParseMailboxID.
type MailboxID struct {
	Namespace string
	Proxy     string
}

// NewMailboxID checks a namespace and a proxy id and joins them. What it
// returns formats to a string ParseMailboxID accepts.
func NewMailboxID(namespace, proxyID string) (MailboxID, error) {
	if err := ValidateNamespaceName(namespace); err != nil {
		return MailboxID{}, err
	}
	if err := ValidateProxyID(proxyID); err != nil {
		return MailboxID{}, err
	}
	id := MailboxID{Namespace: namespace, Proxy: proxyID}
	if n := len(id.String()); n > MaxIDLen {
		return MailboxID{}, invalid("mailbox_id", "%d bytes, at most %d", n, MaxIDLen)
	}
	return id, nil
}

// ParseMailboxID splits "{namespace}@{proxy_id}", checking the whole id and
// both parts are well formed; CheckMailboxID also applies the name rules.
func ParseMailboxID(s string) (MailboxID, error) {
	if err := validateID("mailbox_id", s, MaxMailboxIDLen); err != nil {
		return MailboxID{}, err
	}
	namespace, proxyID, ok := strings.Cut(s, "@")
	if !ok {
		return MailboxID{}, invalid("mailbox_id", "%q is not of the form namespace@proxy_id", s)
	}
	if err := ValidateNamespaceName(namespace); err != nil {
		return MailboxID{}, fmt.Errorf("mailbox_id %q: %w", s, err)
	}
	if err := ValidateProxyID(proxyID); err != nil {
		return MailboxID{}, fmt.Errorf("mailbox_id %q: %w", s, err)
	}
	return MailboxID{Namespace: namespace, Proxy: proxyID}, nil
}

// String formats the id as "{namespace}@{proxy_id}".
func (m MailboxID) String() string { return m.Namespace + "@" + m.Proxy }

// PathSafe reports whether a mailbox id can name one directory as it is:
// non-empty, not "." or "..", and without '/', '\' or NUL. Runners keep a
// store per mailbox and refuse any other id before touching the disk. It is
// weaker than ParseMailboxID on purpose: a runner started by hand serves
// ids no admin cluster assigned.
func PathSafe(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\\\x00")
}

// MaxEchoLen bounds an id a refusal echoes back: enough for any valid id
// (MaxIDLen) and a little more, so an invalid one is still recognisable.
const MaxEchoLen = 256

// Echo is id as an error message may repeat it: whole up to MaxEchoLen
// bytes, else its first MaxEchoLen bytes (never a split UTF-8 sequence) and
// "…", so a client sending a 10 KB id does not get 10 KB back in every
// refusal or log line.
func Echo(id string) string {
	if len(id) <= MaxEchoLen {
		return id
	}
	cut := MaxEchoLen
	for cut > MaxEchoLen-utf8.UTFMax && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return id[:cut] + "…"
}
