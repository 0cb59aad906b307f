package tests

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/prism-mesh/prism/internal/testbin"
)

// TestMailboxDevCurlLine runs `prism dev` and follows the curl line it
// prints: it must return demo events. SIGINT then stops everything cleanly.
func TestMailboxDevCurlLine(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "dev", "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--rate", "100", "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()

	curl := regexp.MustCompile(`curl -s '(http://127\.0\.0\.1:\d+/v1/mailboxes/demo@proxy-01/events\?limit=5)'`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := curl.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		exited <- cmd.Wait()
	}()
	var url string
	select {
	case url = <-found:
	case <-time.After(90 * time.Second):
		t.Fatal("prism dev printed no curl line within 90s")
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Items []struct {
			MessageID string `json:"message_id"`
			Principal string `json:"principal"`
		} `json:"items"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(body.Items) == 0 || body.Items[0].Principal == "" {
		t.Fatalf("GET %s: %d, %v, %+v", url, resp.StatusCode, err, body)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred cleanup
		if err != nil {
			t.Fatalf("prism dev exited with %v after SIGINT", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("prism dev did not stop within 60s of SIGINT")
	}
}
