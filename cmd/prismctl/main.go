// Command prismctl administers a Prism admin cluster.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "prismctl",
		Short:         "Administer a Prism mailbox mesh admin cluster",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prismctl:", err)
		os.Exit(1)
	}
}
