// Package testbin builds the project's binaries once per test process so that
// multi-process tests run the real commands without depending on `make build`.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
	dir   string
)

// Path returns the path of the named command under cmd/ (e.g. "prism"),
// building it with the race detector off on first use. Callers own no cleanup:
// the binaries live in one temporary directory per process.
func Path(name string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p, nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "prism-testbin-")
		if err != nil {
			return "", fmt.Errorf("testbin dir: %w", err)
		}
		dir = d
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, b)
	}
	built[name] = out
	return out, nil
}

func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("testbin: cannot locate source")
	}
	return filepath.Join(filepath.Dir(file), "..", ".."), nil
}
