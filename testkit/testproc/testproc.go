// Package testproc runs the prism binary as child processes for the multi-process tests: each with its output
// in a log file, killed when the test ends, and the tail of its log printed when the test failed.
package testproc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testbin"
)

// tailLines is how much of each log a failed test prints.
const tailLines = 60

// FreeAddr returns a loopback host:port that nothing listened on a moment ago: for a process to listen on, or
// as a dead endpoint. The port is drawn below Linux's ephemeral range (32768-60999 by default), not from it:
// between this call and the child's bind, any outgoing connection on the machine (a Kafka client, a gRPC
// dial) may be given an ephemeral port, and a CI run lost a runner to "address already in use" that way.
// A port is never handed out twice by one test process.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	for range 1000 {
		p := portLow + rand.IntN(portHigh-portLow)
		if ports.given[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		_ = l.Close()
		ports.given[p] = true
		return addr
	}
	t.Fatal("testproc: no free port below the ephemeral range after 1000 tries")
	return ""
}

// The ports FreeAddr draws from, and those it gave out.
const portLow, portHigh = 20000, 32000

var ports = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// Proc is one `prism` process, possibly restarted: every run appends to the same log.
type Proc struct {
	Name    string
	LogPath string
	t       testing.TB
	bin     string
	args    []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // of the current run, set before exited closes
}

// Start runs `prism args...` as name, with stdout and stderr in a log file under t's temp dir.
func Start(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: name, LogPath: filepath.Join(t.TempDir(), name+".log"), t: t, bin: bin, args: args}
	p.run()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- %s log tail ---\n%s", name, p.Tail(tailLines))
		}
	})
	return p
}

// Restart runs the process again with the same arguments (so on the same addresses and data directory) once
// it is gone.
func (p *Proc) Restart() {
	p.t.Helper()
	if p.Alive() {
		p.t.Fatalf("restart %s: still running", p.Name)
	}
	p.run()
}

func (p *Proc) run() {
	p.t.Helper()
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.err = cmd, exited, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		if p.cmd == cmd {
			p.err = err
		}
		p.mu.Unlock()
		close(exited)
	}()
}

func (p *Proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// Pid is the process id of the current run.
func (p *Proc) Pid() int {
	cmd, _ := p.current()
	return cmd.Process.Pid
}

// Exited closes once the current run is gone.
func (p *Proc) Exited() <-chan struct{} {
	_, exited := p.current()
	return exited
}

// Alive reports whether the process is running (a paused process is).
func (p *Proc) Alive() bool {
	select {
	case <-p.Exited():
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL (kill -9) unless the process is gone already, and waits for it to be gone.
func (p *Proc) Kill() {
	cmd, exited := p.current()
	select {
	case <-exited:
	default:
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

// Pause stops the process with SIGSTOP: it keeps its sockets and state but answers nothing until Resume.
// It returns once the kernel reports every thread stopped, so a request sent after Pause is certainly
// queued, not answered by a thread that had yet to stop.
func (p *Proc) Pause() {
	p.t.Helper()
	p.signal(syscall.SIGSTOP)
	tasks := fmt.Sprintf("/proc/%d/task", p.Pid())
	deadline := time.Now().Add(5 * time.Second)
	for !stopped(tasks) {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not stopped 5s after SIGSTOP", p.Name)
		}
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether every thread under tasks (/proc/<pid>/task) is in state T: the state field of
// each stat file follows the parenthesised command name.
func stopped(tasks string) bool {
	stats, err := filepath.Glob(filepath.Join(tasks, "*", "stat"))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Resume continues a paused process with SIGCONT.
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

func (p *Proc) signal(s syscall.Signal) {
	p.t.Helper()
	cmd, _ := p.current()
	if err := cmd.Process.Signal(s); err != nil {
		p.t.Fatalf("%v to %s: %v", s, p.Name, err)
	}
}

// Term sends SIGTERM and waits up to d for the exit; it returns the exit error, or an error if the process is
// still running after d.
func (p *Proc) Term(d time.Duration) error {
	cmd, exited := p.current()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		p.mu.Lock()
		defer p.mu.Unlock()
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
