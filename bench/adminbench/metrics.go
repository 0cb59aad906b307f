package main

import (
	"bufio"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// bucket is one cumulative bucket of a Prometheus histogram.
type bucket struct{ le, n float64 }

// scrapeHistogram reads the finite buckets of histogram name from url,
// sorted by bound.
func scrapeHistogram(url, name string) ([]bucket, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var bs []bucket
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		rest := l[len(prefix):]
		end := strings.IndexByte(rest, '"')
		f := strings.Fields(rest)
		le, err1 := strconv.ParseFloat(rest[:end], 64)
		n, err2 := strconv.ParseFloat(f[len(f)-1], 64)
		if rest[:end] == "+Inf" || err1 != nil || err2 != nil {
			continue
		}
		bs = append(bs, bucket{le, n})
	}
	if len(bs) == 0 {
		return nil, fmt.Errorf("no buckets of %s at %s", name, url)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	return bs, nil
}

// since is the histogram of the observations made between scrapes before
// and bs, so setup work before a timed phase stays out of its figure.
func since(before, bs []bucket) ([]bucket, error) {
	if len(before) != len(bs) {
		return nil, fmt.Errorf("histogram buckets changed between scrapes: %d then %d", len(before), len(bs))
	}
	out := make([]bucket, len(bs))
	for i, b := range bs {
		out[i] = bucket{b.le, b.n - before[i].n}
	}
	return out, nil
}

// quantile estimates quantile q of the histogram, interpolating linearly
// inside the bucket (as histogram_quantile does).
func quantile(bs []bucket, q float64) float64 {
	total := bs[len(bs)-1].n
	rank := q * total
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if b.n == prevN {
				return b.le
			}
			return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN)
		}
		prevLe, prevN = b.le, b.n
	}
	return bs[len(bs)-1].le
}

// scrapeGauge reads the unlabelled gauge or counter name from url.
func scrapeGauge(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no %s at %s", name, url)
}
