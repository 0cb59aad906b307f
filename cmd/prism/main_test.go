package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/prism-mesh/prism/testkit/testbin"
)

// TestInvokedAsPrismctl: prism run through a link named prismctl, as the
// image ships it, is prismctl, with prismctl's exit codes; under its own
// name it is still prism.
func TestInvokedAsPrismctl(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("prism")
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "prismctl")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		code int
		want string
	}{
		{"prismctl version", []string{link, "version", "--client"}, 0, `(?m)^client\s+dev\s+\(go\S+, \w+/\w+\)$`},
		// 2 is prismctl's usage error; prism exits 1 for any error.
		{"prismctl usage error", []string{link, "no-such-command"}, 2, `^prismctl: unknown command "no-such-command" for "prismctl"`},
		{"prism as itself", []string{bin, "--version"}, 0, `^prism version dev\n$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(tc.argv[0], tc.argv[1:]...).CombinedOutput()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !regexp.MustCompile(tc.want).Match(out) {
				t.Errorf("%q exited %d:\n%s\nwant exit %d and output matching %s", tc.argv, code, out, tc.code, tc.want)
			}
		})
	}
}
