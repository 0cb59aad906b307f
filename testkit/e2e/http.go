package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HTTP is a client for probing the processes' HTTP listeners.
type HTTP struct{ c *http.Client }

// NewHTTP bounds each request by timeout (none when 0). For https URLs it presents the harness's reader
// identity (a runner's query API over mutual TLS).
func NewHTTP(timeout time.Duration) HTTP {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg, err := readerTLS(); err == nil {
		tr.TLSClientConfig = cfg
	}
	return HTTP{&http.Client{Timeout: timeout, Transport: tr}}
}

// Get returns the status code, body and headers of a GET of url.
func (h HTTP) Get(url string) (int, string, http.Header, error) {
	resp, err := h.c.Get(url)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// ErrNoSeries is Metric's error when no series matches.
var ErrNoSeries = errors.New("no matching series")

// Label is the text of a label in the exposition format, k="v", as Metric matches it.
func Label(k, v string) string { return k + `="` + v + `"` }

// Metric scrapes base/metrics and sums the samples of name whose line contains every one of labels (each
// usually a Label); it is an error (ErrNoSeries) if no series matches.
func (h HTTP) Metric(base, name string, labels ...string) (float64, error) {
	resp, err := h.c.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: HTTP %d", resp.StatusCode)
	}
	var sum float64
	matched := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += f
		matched++
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if matched == 0 {
		return 0, fmt.Errorf("%s%v: %w", name, labels, ErrNoSeries)
	}
	return sum, nil
}
