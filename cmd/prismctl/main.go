// Command prismctl administers a Prism admin cluster (admin/ctl). prism runs
// the same code when invoked as prismctl, as it is in the image.
package main

import (
	"os"

	"github.com/prism-mesh/prism/admin/ctl"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	os.Exit(ctl.Main(version, os.Args[1:]))
}
