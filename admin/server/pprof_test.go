package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestWithPprof(t *testing.T) {
	t.Parallel()
	inner := http.NewServeMux()
	inner.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) })
	h := withPprof(inner)
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/debug/pprof/", http.StatusOK},
		{"/debug/pprof/goroutine?debug=1", http.StatusOK},
		{"/metrics", http.StatusOK},
		{"/nothing", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.want)
		}
	}
}
