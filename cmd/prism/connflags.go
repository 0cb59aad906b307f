package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/internal/connlimit"
)

// connFlags are the connection bounds of a command's listeners, the same
// flags on every command (docs/operations.md#connection-bounds).
type connFlags struct {
	b connlimit.Bounds
}

func (f *connFlags) register(fs *pflag.FlagSet, listeners string) {
	d := connlimit.Default
	fs.DurationVar(&f.b.Handshake, "conn-handshake-timeout", d.Handshake,
		"a connection to "+listeners+" that has not finished its TLS handshake and HTTP/2 preface (or sent its first request's headers) this long after it was accepted is closed")
	fs.DurationVar(&f.b.Idle, "conn-idle-timeout", d.Idle,
		"a connection to "+listeners+" without a request or stream in progress this long is sent away (GOAWAY, or closed between HTTP/1.1 requests); pings do not count, and clients reconnect when they next call")
	fs.DurationVar(&f.b.PingEvery, "conn-min-ping-interval", d.PingEvery,
		"the most often a client of "+listeners+" may ping (HTTP/2 PING, gRPC keepalive): three pings in a row sooner than this after the previous one, with no answer in between, and the connection is sent away with GOAWAY too_many_pings (the mesh's own clients ping at most every 10s)")
}

// bounds are the flags' bounds: a zero one is its default (flags built in
// code, as prism dev builds them, set none), a negative one an error.
func (f *connFlags) bounds() (connlimit.Bounds, error) {
	var errs []error
	for _, c := range []struct {
		flag string
		d    time.Duration
	}{{"--conn-handshake-timeout", f.b.Handshake}, {"--conn-idle-timeout", f.b.Idle}, {"--conn-min-ping-interval", f.b.PingEvery}} {
		if c.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative", c.flag, c.d))
		}
	}
	return f.b.WithDefaults(), errors.Join(errs...)
}
