package server

import (
	"net/http"
	"net/http/pprof"
)

// withPprof serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/ beside h, as etcd does with --enable-pprof: the way to see
// where a leader's CPU or heap goes in a real cluster. Off by default: the
// HTTP listener is plaintext and unauthenticated, and a profile names the
// code and can hold the CPU for its duration.
func withPprof(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.Handle("/", h)
	return mux
}
