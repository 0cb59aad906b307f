// Command prism runs the parts of the mailbox mesh: admin, runner, sidecar,
// gateway, inject and dev (everything on one machine).
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
		Use:           "prism",
		Short:         "Prism mailbox mesh: searchable event store as a service mesh",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(subcommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prism:", err)
		os.Exit(1)
	}
}
