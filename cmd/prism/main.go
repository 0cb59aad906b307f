// Command prism runs the parts of the mailbox mesh: admin, runner, sidecar,
// gateway, inject and dev (everything on one machine).
package main

import (
	"fmt"
	"os"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	// Mailbox stores and Raft logs hold users' events and leases: files are created owner-only (0600, directories
	// 0700) from the start, rather than at the stores' permission sweeps, which cover what exists when they run.
	syscall.Umask(0o077)
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
