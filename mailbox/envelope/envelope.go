// Package envelope decodes PrismEnvelope bytes, validates them under a
// mailbox's validation mode (docs/architecture.md#envelope-validation) and
// extracts the indexed MailboxItem a mailbox stores.
package envelope

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/protobuf/proto"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Mode is a mailbox's envelope validation mode.
type Mode string

const (
	// Strict rejects envelopes that are not version 1 or lack published_at or topic.
	Strict Mode = "strict"
	// Warn logs what strict would reject and stores the envelope anyway.
	Warn Mode = "warn"
	// Disabled skips every check that is not needed to store the envelope.
	Disabled Mode = "disabled"
)

// ParseMode parses a mode name as given on a command line.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Strict, Warn, Disabled:
		return m, nil
	}
	return "", fmt.Errorf("validation mode %q: want strict, warn or disabled", s)
}

// Reason says why an envelope was rejected. Its string is what the dead-letter
// topic carries in the prism-dlq-reason header, so values are stable.
type Reason string

const (
	ReasonUndecodable      Reason = "undecodable"
	ReasonMissingMetadata  Reason = "missing_metadata"
	ReasonMissingMessageID Reason = "missing_message_id"
	ReasonBadVersion       Reason = "unsupported_envelope_version"
	ReasonMissingTime      Reason = "missing_published_at"
	ReasonBadTime          Reason = "invalid_published_at"
	ReasonMissingTopic     Reason = "missing_topic"
)

// SupportedVersion is the only envelope_version strict mode accepts.
const SupportedVersion = 1

// RejectError is returned for an envelope the mailbox must dead-letter.
type RejectError struct {
	Reason Reason
	Err    error // underlying cause, e.g. the protobuf decode error; may be nil
}

func (e *RejectError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("envelope rejected (%s): %v", e.Reason, e.Err)
	}
	return fmt.Sprintf("envelope rejected (%s)", e.Reason)
}

func (e *RejectError) Unwrap() error { return e.Err }

// ReasonOf returns the rejection reason carried by err, or "" if err is not a rejection.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

func reject(r Reason, err error) error { return &RejectError{Reason: r, Err: err} }

// Decode parses PrismEnvelope bytes.
func Decode(b []byte) (*envelopev1.PrismEnvelope, error) {
	env := &envelopev1.PrismEnvelope{}
	if err := proto.Unmarshal(b, env); err != nil {
		return nil, reject(ReasonUndecodable, err)
	}
	return env, nil
}

// Validate checks env under mode. Whatever the mode, an envelope without
// metadata or message_id is rejected: the mailbox deduplicates and addresses
// items by message_id, so such an envelope cannot be stored. In warn mode the
// strict-only problems are logged on log (nil = no logging) and nil is returned.
func Validate(env *envelopev1.PrismEnvelope, mode Mode, log *slog.Logger) error {
	md := env.GetMetadata()
	if md == nil {
		return reject(ReasonMissingMetadata, nil)
	}
	if md.GetMessageId() == "" {
		return reject(ReasonMissingMessageID, nil)
	}
	if mode == Disabled {
		return nil
	}
	var problem error
	switch {
	case env.GetEnvelopeVersion() != SupportedVersion:
		problem = reject(ReasonBadVersion, fmt.Errorf("envelope_version %d, want %d", env.GetEnvelopeVersion(), SupportedVersion))
	case md.GetPublishedAt() == nil:
		problem = reject(ReasonMissingTime, nil)
	case md.GetPublishedAt().CheckValid() != nil:
		problem = reject(ReasonBadTime, md.GetPublishedAt().CheckValid())
	case md.GetTopic() == "":
		problem = reject(ReasonMissingTopic, nil)
	}
	if problem == nil || mode == Strict {
		return problem
	}
	if log != nil {
		log.Warn("storing envelope that strict validation would reject",
			"message_id", md.GetMessageId(), "reason", string(ReasonOf(problem)), "err", problem)
	}
	return nil
}

// ExtractMailboxItem builds the item a mailbox stores for env: its indexed
// headers and blob, the envelope bytes. Missing sub-messages give empty
// headers. When raw holds the bytes env was decoded from, they are stored as
// they arrived; otherwise env is marshalled.
func ExtractMailboxItem(env *envelopev1.PrismEnvelope, raw []byte) (*mailboxv1.MailboxItem, error) {
	blob := raw
	if blob == nil {
		b, err := proto.Marshal(env)
		if err != nil {
			return nil, fmt.Errorf("marshal envelope: %w", err)
		}
		blob = b
	}
	md := env.GetMetadata()
	item := &mailboxv1.MailboxItem{
		MessageId:     md.GetMessageId(),
		Topic:         md.GetTopic(),
		ContentType:   md.GetContentType(),
		SchemaUrl:     env.GetSchema().GetSchemaUrl(),
		SchemaVersion: env.GetSchema().GetSchemaVersion(),
		Encryption:    env.GetSecurity().GetEncryption().GetAlgorithm(),
		CorrelationId: md.GetCorrelationId(),
		Principal:     env.GetSecurity().GetPublisherId(),
		Namespace:     md.GetNamespace(),
		TraceId:       env.GetObservability().GetTraceId(),
		SpanId:        env.GetObservability().GetSpanId(),
		EnvelopeBlob:  blob,
	}
	if ts := md.GetPublishedAt(); ts != nil {
		item.Timestamp = ts.AsTime().UnixMilli()
	}
	if len(env.GetExtensions()) > 0 {
		item.CustomHeaders = make(map[string]string, len(env.GetExtensions()))
		for k, v := range env.GetExtensions() {
			// Item headers are proto3 strings, which must be UTF-8 or the item
			// could never be marshalled (a poison message); the blob keeps the
			// original bytes.
			item.CustomHeaders[k] = strings.ToValidUTF8(string(v), "\uFFFD")
		}
	}
	return item, nil
}

// Process decodes, validates and extracts in one step, which is what ingest
// does per Kafka record. A *RejectError means the record belongs in the DLQ.
// It answers as Decode, Validate and ExtractMailboxItem do, reading only the
// indexed fields when the envelope is one decodeIndexed takes.
func Process(raw []byte, mode Mode, log *slog.Logger) (*mailboxv1.MailboxItem, error) {
	env, item, ok := decodeIndexed(raw)
	if !ok {
		env, err := Decode(raw)
		if err != nil {
			return nil, err
		}
		if err := Validate(env, mode, log); err != nil {
			return nil, err
		}
		return ExtractMailboxItem(env, raw)
	}
	if err := Validate(env, mode, log); err != nil {
		return nil, err
	}
	item.EnvelopeBlob = raw
	return item, nil
}
