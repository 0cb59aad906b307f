package testkit_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/prism-mesh/prism"

// testLand is where importing a kit is the point: the kits themselves and the
// suites under tests/. Every other package of the module is production.
var testLand = []string{module + "/testkit", module + "/tests"}

func inside(pkg string, roots []string) bool {
	for _, r := range roots {
		if pkg == r || strings.HasPrefix(pkg, r+"/") {
			return true
		}
	}
	return false
}

// TestProductionImportsNoTestKit fails when a production package links a test
// kit, directly or through another package: a kit starts processes, brokers and
// fault proxies, and imports testing, none of which belongs in a binary.
// _test.go files are not dependencies of their package, so tests may import kits.
func TestProductionImportsNoTestKit(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH; cannot list package dependencies")
	}
	out, err := exec.Command(goTool, "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list %s/...: %v", module, err)
	}
	production := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || inside(fields[0], testLand) {
			continue
		}
		production++
		for _, dep := range fields[1:] {
			if inside(dep, testLand[:1]) {
				t.Errorf("%s imports the test kit %s", fields[0], dep)
			}
		}
	}
	if production < 20 {
		t.Fatalf("go list %s/... listed %d production packages; the walk is not seeing the module", module, production)
	}
}
