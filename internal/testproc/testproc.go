// Package testproc runs the prism binary as child processes for the multi-process tests: each with its output
// in a log file, killed when the test ends, and the tail of its log printed when the test failed.
package testproc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/testbin"
)

// FreeAddr returns a loopback host:port that nothing listened on a moment ago: for a process to listen on, or
// as a dead endpoint.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Proc is one running `prism` process.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	err     error // set before exited closes
}

// Start runs `prism args...` as name, with stdout and stderr in a log file under t's temp dir.
func Start(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: name, LogPath: filepath.Join(t.TempDir(), name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- %s log tail ---\n%s", name, p.Tail(40))
		}
	})
	return p
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited closes once the process is gone.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL (kill -9) unless the process is gone already, and waits for it to be gone.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// Alive reports whether the process is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Term sends SIGTERM and waits up to d for the exit; it returns the exit error, or an error if the process is
// still running after d.
func (p *Proc) Term(d time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(d):
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.Name, d)
	}
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogHas reports whether the process logged a line containing every part.
func (p *Proc) LogHas(parts ...string) bool {
	found := false
	p.scanLog(func(line []byte) bool {
		for _, s := range parts {
			if !strings.Contains(string(line), s) {
				return true
			}
		}
		found = true
		return false
	})
	return found
}

// LogTime is the time field of the first JSON log line whose msg is msg.
func (p *Proc) LogTime(msg string) (time.Time, bool) {
	var at time.Time
	found := false
	p.scanLog(func(b []byte) bool {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(b, &line) == nil && line.Msg == msg {
			at, found = line.Time, true
			return false
		}
		return true
	})
	return at, found
}

// scanLog calls fn with each log line until fn returns false.
func (p *Proc) scanLog(fn func(line []byte) bool) {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && fn(sc.Bytes()) {
	}
}
