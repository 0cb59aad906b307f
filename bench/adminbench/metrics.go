package main

import (
	"bufio"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// histogramQuantile estimates a quantile of a Prometheus histogram scraped
// from url, interpolating linearly inside the bucket (as histogram_quantile
// does).
func histogramQuantile(url, name string, q float64) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	type bucket struct{ le, n float64 }
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
		return 0, fmt.Errorf("no buckets of %s at %s", name, url)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	total := bs[len(bs)-1].n
	rank := q * total
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if b.n == prevN {
				return b.le, nil
			}
			return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN), nil
		}
		prevLe, prevN = b.le, b.n
	}
	return bs[len(bs)-1].le, nil
}
