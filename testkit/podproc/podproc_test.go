package podproc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestMain makes the test binary a container when asked: it serves, on 0.0.0.0:7001, the file mounted at
// /etc/podproc/data, what the hosts file says peer.example is, and the user it runs as.
func TestMain(m *testing.M) {
	if os.Getenv("PODPROC_HELPER") == "" {
		os.Exit(m.Run())
	}
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		data, _ := os.ReadFile("/etc/podproc/data/value")
		addrs, err := net.DefaultResolver.LookupHost(context.Background(), "peer.example")
		werr := os.WriteFile("/podproc-written", nil, 0o644)
		fmt.Fprintf(w, "%s %v %v uid=%d root-writable=%v", data, addrs, err, os.Getuid(), werr == nil)
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe("0.0.0.0:7001", nil))
	os.Exit(1)
}

// Two pods bind the same wildcard port, each sees its own volume and the hosts file, runs as the user it is
// given on a read-only root (root included), and is reached at its own IP.
func TestPodsHaveTheirOwnNetworkAndMounts(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skip(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	n := NewNetwork(t)
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, Hosts(map[string]netip.Addr{"peer.example": n.Gateway}), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, uid := range []int{-1, 65532} {
		pod := n.NewPod(fmt.Sprintf("pod-%d", i))
		data := t.TempDir()
		if err := os.WriteFile(filepath.Join(data, "value"), []byte(pod.Name), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd, err := pod.Command(Container{
			Argv: []string{self}, Env: []string{"PODPROC_HELPER=1"}, Hosts: hosts, UID: uid, GID: uid, ReadOnlyRoot: true,
			Mounts: []Mount{{Source: data, Target: "/etc/podproc/data", ReadOnly: true}},
		})
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		want := fmt.Sprintf("%s [%s] <nil> uid=%d root-writable=false", pod.Name, n.Gateway, max(uid, 0))
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			resp, err := http.Get("http://" + net.JoinHostPort(pod.IP.String(), "7001"))
			if err != nil {
				got = err.Error()
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = string(b)
			break
		}
		if got != want {
			t.Errorf("pod %s at %s answers %q, want %q", pod.Name, pod.IP, got, want)
		}
	}
	if _, err := os.Stat("/etc/podproc"); err != nil {
		t.Fatalf("mount point: %v", err)
	}
}
