// Package testbin builds the project's binaries once per test process so that
// multi-process tests run the real commands without depending on `make build`.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Path returns the path of the named command under cmd/ (e.g. "prism"),
// building it with the race detector off on first use in this process.
//
// The binaries live in the user's cache directory, one place per checkout
// (~/.cache/prism-testbin/<hash of the module root>/), not in a temporary
// directory per test process: `go test ./...` runs a process per package, and
// ~100 MB each filled /tmp. Each build goes to a temporary name and is renamed
// into place, so a test of another package that runs the binary at the same
// moment sees the old file or the new one, never half of one; both are built
// from the same sources in one `go test` run.
func Path(name string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := cacheDir(root)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, name+".build-*")
	if err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	_ = tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, b)
	}
	out := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	built[name] = out
	return out, nil
}

// staleAfter is how long a checkout's binaries stay once nothing has built
// there: checkouts come and go (worktrees, clones in temporary directories),
// and each leaves ~150 MB behind.
const staleAfter = 7 * 24 * time.Hour

func cacheDir(root string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	base = filepath.Join(base, "prism-testbin")
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(base, hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	pruneStale(base, dir, time.Now())
	return dir, nil
}

// pruneStale removes the other checkouts' directories under base that no
// build has touched (a build renames a binary in, which changes the
// directory's modification time) for staleAfter.
func pruneStale(base, keep string, now time.Time) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(base, e.Name())
		if path == keep || !e.IsDir() {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > staleAfter {
			_ = os.RemoveAll(path)
		}
	}
}

func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("testbin: cannot locate source")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}
