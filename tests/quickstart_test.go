package tests

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/testkit/testbin"
)

// quickstartLines returns the command lines of the ```sh block in the
// README's "## Quickstart" section, comments and blank lines left out.
func quickstartLines(readme string) ([]string, error) {
	_, sec, ok := strings.Cut(readme, "\n## Quickstart\n")
	if !ok {
		return nil, errQuickstart("no \"## Quickstart\" section")
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	_, block, ok := strings.Cut("\n"+sec, "\n```sh\n")
	if !ok {
		return nil, errQuickstart("no ```sh block in the Quickstart section")
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		return nil, errQuickstart("unterminated ```sh block")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return nil, errQuickstart("empty ```sh block")
	}
	return lines, nil
}

type errQuickstart string

func (e errQuickstart) Error() string { return "README quickstart: " + string(e) }

var (
	loopbackAddr = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	binPath      = regexp.MustCompile(`\./bin/(\w+)`)
	quotedURL    = regexp.MustCompile(`'(http://[^']+)'`)
)

// TestQuickstart runs prism dev as a real process and then, once it is
// ready, exactly the lines of the README's Quickstart block, as a user types
// them in a second terminal. Two deterministic rewrites make that possible
// on a shared machine: the README's default ports (gateway 127.0.0.1:8080,
// admin 127.0.0.1:7001) become the free ports this prism dev was given, and
// ./bin/NAME becomes the binary built for the test. Every line must exit 0;
// every curl line must answer JSON, and an events query must list events.
// The README tells users to re-run a curl that finds no events yet (the new
// mailbox is still being opened, leased and routed); the test does the same,
// bounded at 60s.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := quickstartLines(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("the README's lines are shell lines: %v", err)
	}
	_, curlErr := exec.LookPath("curl")
	if curlErr != nil {
		t.Log("curl is not on PATH: curl lines are run as GET of their quoted URL with Go's http client")
	}

	d := startDev(t)
	ports := map[string]string{
		"127.0.0.1:8080": d.addrs["--gateway-addr"],
		"127.0.0.1:7001": d.addrs["--admin-addr"],
	}
	for _, l := range lines {
		for _, a := range loopbackAddr.FindAllString(l, -1) {
			if _, ok := ports[a]; !ok {
				t.Fatalf("README quickstart line %q uses %s, which this test does not map to prism dev's flags", l, a)
			}
		}
	}
	for i, readmeLine := range lines {
		line := loopbackAddr.ReplaceAllStringFunc(readmeLine, func(a string) string { return ports[a] })
		line = binPath.ReplaceAllStringFunc(line, func(m string) string {
			p, err := testbin.Path(strings.TrimPrefix(m, "./bin/"))
			if err != nil {
				t.Fatal(err)
			}
			return p
		})
		t.Logf("line %d: %s\n  runs as: %s", i+1, readmeLine, line)
		if strings.HasPrefix(line, "curl ") {
			runCurlLine(t, bash, line, curlErr == nil)
			continue
		}
		out, err := runLine(bash, line, client.EnvConfig+"="+d.ctlConfig)
		if err != nil {
			t.Fatalf("line %d %q: %v\n%s", i+1, readmeLine, err, out)
		}
		t.Logf("  output:\n%s", out)
	}
	d.interrupt(t)
}

// runLine runs line in a shell with env added, as the user's second
// terminal (where prismctl finds the config file prism dev wrote).
func runLine(bash, line string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-c", line)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runCurlLine runs a curl line until it answers JSON (with events, for an
// events query), within 60s.
func runCurlLine(t *testing.T, bash, line string, haveCurl bool) {
	t.Helper()
	wantEvents := strings.Contains(line, "/events")
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
		out, err := curlOnce(bash, line, haveCurl)
		var body struct {
			Items []json.RawMessage `json:"items"`
			Error string            `json:"error"`
		}
		if err == nil {
			err = json.Unmarshal([]byte(out), &body)
		}
		switch {
		case err != nil:
		case body.Error != "":
			err = errQuickstart("error answer: " + out)
		case wantEvents && len(body.Items) == 0:
			err = errQuickstart("no events yet: " + out)
		default:
			if len(out) > 400 {
				out = out[:400] + "..."
			}
			t.Logf("  answered (attempt %d): %s", attempt, out)
			return
		}
		if attempt == 1 {
			t.Logf("  not yet, running it again as the README says: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q: no JSON answer with events within 60s (%d attempts): %v\n%s", line, attempt, err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func curlOnce(bash, line string, haveCurl bool) (string, error) {
	if haveCurl {
		return runLine(bash, line)
	}
	m := quotedURL.FindStringSubmatch(line)
	if m == nil {
		return "", errQuickstart("curl line without a quoted http URL: " + line)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(m[1])
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestQuickstartLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, readme string
		want         []string
		err          bool
	}{
		{"block", "# P\n\n## Quickstart\n\ntext\n\n```sh\n# comment\na 1\n\nb 2\n```\n\n## Next\n```sh\nc\n```\n", []string{"a 1", "b 2"}, false},
		{"last section", "## Quickstart\n```sh\na\n```", []string{"a"}, false},
		{"no section", "# P\n## Other\n```sh\na\n```\n", nil, true},
		{"block in the next section only", "## Quickstart\ntext\n## Next\n```sh\na\n```\n", nil, true},
		{"unterminated", "## Quickstart\n```sh\na\n", nil, true},
		{"only comments", "## Quickstart\n```sh\n# a\n```\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := quickstartLines("\n" + tc.readme)
			if (err != nil) != tc.err || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("quickstartLines = %q, %v; want %q, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}
