package httpapi

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// queryParams are the parameters GET /v1/mailboxes/{id}/events accepts; any
// other is refused so a typo ("principals=") is not silently ignored.
var queryParams = []string{"topic", "principal", "correlation_id", "trace_id", "start", "end", "limit", "page_token"}

// MaxParams bounds the parameters of one query string. A query means at
// most 2*mesh.MaxFilterValues list values and one of each other parameter
// (206); a query string with more pieces is refused before any is
// unescaped, so a client cannot make the parser do unbounded work or, as
// url.ParseQuery does past its own bound, have part of its query ignored.
const MaxParams = 256

// ParseQuery turns a raw query string (the URL's RawQuery) into an
// EventFilter, or refuses it with an error naming the parameter at fault
// (docs/query-api.md#filter): more than MaxParams parameters, a malformed
// percent-escape, a value that is not UTF-8, an unknown parameter, one
// given more than once that is not a list, an empty value, and each
// parameter's own form. topic and principal may repeat and hold
// comma-separated values; start and end are RFC 3339 times or unix
// milliseconds; limit is clamped to mesh.MaxQueryLimit; page_token must
// have a token's form (mesh.CheckPageToken). What it accepts,
// request.Filter accepts too.
func ParseQuery(raw string) (*mailboxv1.EventFilter, error) {
	q, err := parseParams(raw, queryParams)
	if err != nil {
		return nil, err
	}
	f := &mailboxv1.EventFilter{}
	if f.Topics, err = list(q, "topic"); err != nil {
		return nil, err
	}
	if f.Principals, err = list(q, "principal"); err != nil {
		return nil, err
	}
	if f.CorrelationId, err = single(q, "correlation_id"); err != nil {
		return nil, err
	}
	if f.TraceId, err = single(q, "trace_id"); err != nil {
		return nil, err
	}
	if f.PageToken, err = single(q, "page_token"); err != nil {
		return nil, err
	}
	if f.PageToken != "" {
		if err := mesh.CheckPageToken(f.PageToken); err != nil {
			return nil, errors.New(request.Reason(err))
		}
	}
	if f.StartTime, err = timeParam(q, "start"); err != nil {
		return nil, err
	}
	if f.EndTime, err = timeParam(q, "end"); err != nil {
		return nil, err
	}
	if f.StartTime != nil && f.EndTime != nil && !f.StartTime.AsTime().Before(f.EndTime.AsTime()) {
		return nil, errors.New("start: must be before end")
	}
	s, err := single(q, "limit")
	if err != nil {
		return nil, err
	}
	if s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("limit: want a whole number from 0 to %d, got %q", mesh.MaxQueryLimit, mesh.Echo(s))
		}
		f.Limit = int32(min(n, mesh.MaxQueryLimit))
	}
	return f, nil
}

// ParseNoParams refuses any parameter in a raw query string, for the paths
// that take none (.../events/{message_id}, .../stats): a parameter there is
// a mistake the client should hear of, as on .../events.
func ParseNoParams(raw string) error {
	_, err := parseParams(raw, nil)
	return err
}

// parseParams splits a raw query string as url.ParseQuery does ('&'
// between parameters, '=' between name and value, '+' and percent-escapes
// unescaped, empty pieces skipped) but refuses instead of skipping: more
// than MaxParams pieces, a malformed escape, a name not in accepted, a
// value that is not UTF-8 (a protobuf string cannot carry it). A ';' is
// no separator (url.ParseQuery refuses it too): it stays in the name or
// value it is in.
func parseParams(raw string, accepted []string) (url.Values, error) {
	q := url.Values{}
	if raw == "" {
		return q, nil
	}
	if n := strings.Count(raw, "&") + 1; n > MaxParams {
		return nil, fmt.Errorf("query: %d parameters, at most %d", n, MaxParams)
	}
	for piece := range strings.SplitSeq(raw, "&") {
		if piece == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(piece, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			return nil, fmt.Errorf("%s: %v in the parameter name", strconv.Quote(mesh.Echo(rawKey)), err)
		}
		if !slices.Contains(accepted, key) {
			if len(accepted) == 0 {
				return nil, fmt.Errorf("%s: unknown parameter (this path takes none)", strconv.Quote(mesh.Echo(key)))
			}
			return nil, fmt.Errorf("%s: unknown parameter (accepted: %v)", strconv.Quote(mesh.Echo(key)), accepted)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", key, err)
		}
		if !utf8.ValidString(value) {
			return nil, fmt.Errorf("%s: %q is not UTF-8", key, mesh.Echo(value))
		}
		q[key] = append(q[key], value)
	}
	return q, nil
}

func list(q url.Values, name string) ([]string, error) {
	vals := splitValues(q[name])
	for _, v := range vals {
		if v == "" {
			return nil, fmt.Errorf("%s: empty value", name)
		}
	}
	if len(vals) > mesh.MaxFilterValues {
		return nil, fmt.Errorf("%s: at most %d values, got %d", name, mesh.MaxFilterValues, len(vals))
	}
	return vals, nil
}

func single(q url.Values, name string) (string, error) {
	vals := q[name]
	switch {
	case len(vals) > 1:
		return "", fmt.Errorf("%s: given %d times, want at most once", name, len(vals))
	case len(vals) == 1 && vals[0] == "":
		return "", fmt.Errorf("%s: empty value", name)
	case len(vals) == 1:
		return vals[0], nil
	}
	return "", nil
}

// Unix milliseconds above maxUnixMillis are surely microseconds or
// nanoseconds, or garbage, and would overflow a timestamp; from 1 to
// minUnixMillis-1 (before 1973-03-03) they are surely seconds: a time in
// seconds from then to the year 5138 falls there, and an event before 1973
// is not. 0 stays the beginning of time.
const (
	maxUnixMillis = 253402300799999 // 9999-12-31T23:59:59.999Z
	minUnixMillis = 100000000000    // 1973-03-03T09:46:40Z
)

func timeParam(q url.Values, name string) (*timestamppb.Timestamp, error) {
	s, err := single(q, name)
	if err != nil || s == "" {
		return nil, err
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		switch {
		case ms < 0:
			return nil, fmt.Errorf("%s: unix milliseconds out of range: %d", name, ms)
		case ms > maxUnixMillis:
			return nil, fmt.Errorf("%s: %d is past the year 9999 in unix milliseconds (microseconds or nanoseconds?): %s takes unix milliseconds or an RFC 3339 time", name, ms, name)
		case ms > 0 && ms < minUnixMillis:
			return nil, fmt.Errorf("%s: %d looks like unix seconds (%s): %s takes unix milliseconds (%d) or an RFC 3339 time",
				name, ms, time.Unix(ms, 0).UTC().Format(time.RFC3339), name, ms*1000)
		}
		return timestamppb.New(time.UnixMilli(ms)), nil
	}
	// RFC 3339 allows a lower-case 't' and 'z' (section 5.6), which Go's
	// layout does not; nothing else in a valid time has a letter.
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s))
	if err != nil {
		return nil, fmt.Errorf("%s: want an RFC 3339 time or unix milliseconds, got %q", name, mesh.Echo(s))
	}
	ts := timestamppb.New(t)
	if err := ts.CheckValid(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return ts, nil
}

func splitValues(vals []string) []string {
	var out []string
	for _, v := range vals {
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}
