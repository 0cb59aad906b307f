package raftnode

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter lets hashicorp/raft and raft-wal log through the process's slog
// handler, so their lines carry the same node attributes and format as ours.
type hclogAdapter struct {
	l     *slog.Logger
	name  string
	args  []any
	level hclog.Level
	// term, when it returns non-zero, stamps every line with the current
	// raft term, so logs of different nodes can be lined up by term.
	term func() uint64
}

func newHclog(l *slog.Logger, level hclog.Level, term func() uint64) hclog.Logger {
	return &hclogAdapter{l: l, level: level, term: term}
}

func toSlogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || level < h.level {
		return
	}
	l := h.l
	if h.name != "" {
		l = l.With("component", h.name)
	}
	all := normalize(append(h.args[:len(h.args):len(h.args)], args...))
	if t := h.term(); t > 0 && !hasKey(all, "term") {
		all = append(all, "term", t)
	}
	l.Log(context.Background(), toSlogLevel(level), msg, all...)
}

// normalize renders hclog.Fmt values and renames raft's own "node" (a
// description like "Node at a1 [Leader]") so it does not shadow our node id.
func normalize(args []any) []any {
	out := make([]any, len(args))
	copy(out, args)
	for i := 0; i+1 < len(out); i += 2 {
		if out[i] == "node" {
			out[i] = "raft_node"
		}
		if f, ok := out[i+1].(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				out[i+1] = fmt.Sprintf(format, f[1:]...)
			}
		}
	}
	return out
}

func hasKey(args []any, key string) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] == key {
			return true
		}
	}
	return false
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) IsTrace() bool { return h.level <= hclog.Trace }
func (h *hclogAdapter) IsDebug() bool { return h.level <= hclog.Debug }
func (h *hclogAdapter) IsInfo() bool  { return h.level <= hclog.Info }
func (h *hclogAdapter) IsWarn() bool  { return h.level <= hclog.Warn }
func (h *hclogAdapter) IsError() bool { return h.level <= hclog.Error }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(h.args[:len(h.args):len(h.args)], args...)
	return &c
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

func (h *hclogAdapter) SetLevel(level hclog.Level) { h.level = level }
func (h *hclogAdapter) GetLevel() hclog.Level      { return h.level }

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(h.l.Handler(), toSlogLevel(h.level))
}

func (h *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return h.StandardLogger(opts).Writer()
}
