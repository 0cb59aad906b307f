package debughttp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWith(t *testing.T) {
	t.Parallel()
	inner := http.NewServeMux()
	inner.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) })
	h := With(inner)
	for _, tc := range []struct {
		path string
		want int
		body []string
	}{
		{"/debug/pprof/", http.StatusOK, nil},
		{"/debug/pprof/goroutine?debug=1", http.StatusOK, nil},
		{"/debug/runtime-metrics", http.StatusOK, []string{"/sched/latencies:seconds count=", "/cpu/classes/gc/mark/assist:cpu-seconds ", "/gc/cycles/total:gc-cycles "}},
		{"/metrics", http.StatusOK, []string{"metrics"}},
		{"/nothing", http.StatusNotFound, nil},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.want)
		}
		for _, want := range tc.body {
			if !strings.Contains(rec.Body.String(), want) {
				t.Errorf("GET %s lacks %q", tc.path, want)
			}
		}
	}
}
