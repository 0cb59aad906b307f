package payload

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

func TestMake(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 300, 704, 2000} {
		r := rand.New(rand.NewPCG(uint64(size), 1))
		for range 50 {
			j := JSON.Make(r, size)
			if !json.Valid(j) {
				t.Fatalf("JSON payload of %d is not JSON: %s", size, j)
			}
			if size >= 704 && (len(j) < size || len(j) > size+120) {
				t.Errorf("JSON payload for %d bytes has %d", size, len(j))
			}
			if b := Random.Make(r, size); len(b) != size {
				t.Errorf("random payload for %d bytes has %d", size, len(b))
			}
		}
	}
	if _, err := Parse("xml"); err == nil {
		t.Error("Parse accepted xml")
	}
}
