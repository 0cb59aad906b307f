package runner

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestPprofOnlyWhenAsked: the profiles and runtime metrics are on the
// plaintext HTTP port with Config.Pprof, and nowhere without it; the query
// port never serves them.
func TestPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		pprof bool
		want  int
	}{
		{"off by default", false, http.StatusNotFound},
		{"on with Pprof", true, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := New(Config{DataDir: t.TempDir(), Brokers: []string{"127.0.0.1:1"}, Pprof: tc.pprof})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			queryAddr, httpAddr := serve(t, r)
			get := func(url string) (int, string) {
				t.Helper()
				resp, err := http.Get(url)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp.StatusCode, string(b)
			}
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/runtime-metrics"} {
				if code, _ := get("http://" + httpAddr + path); code != tc.want {
					t.Errorf("http port GET %s = %d, want %d", path, code, tc.want)
				}
				if code, _ := get("http://" + queryAddr + path); code != http.StatusNotFound {
					t.Errorf("query port GET %s = %d, want 404", path, code)
				}
			}
			if code, _ := get("http://" + httpAddr + "/healthz"); code != http.StatusOK {
				t.Errorf("GET /healthz = %d, want 200", code)
			}
			if !tc.pprof {
				return
			}
			_, body := get("http://" + httpAddr + "/debug/runtime-metrics")
			for _, want := range []string{"/sched/latencies:seconds count=", "/cpu/classes/gc/mark/assist:cpu-seconds ", "/gc/cycles/total:gc-cycles "} {
				if !strings.Contains(body, want) {
					t.Errorf("/debug/runtime-metrics lacks %q", want)
				}
			}
		})
	}
}
