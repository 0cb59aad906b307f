// Command prism runs the parts of the mailbox mesh: admin, runner, sidecar,
// gateway, inject and dev (everything on one machine). Invoked as prismctl
// (a link named so) it is prismctl.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/admin/ctl"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	// The image ships prismctl as a symbolic link to prism, busybox style: the
	// two binaries would hold nearly the same code twice.
	// Before the umask: prismctl standalone keeps the user's.
	if filepath.Base(os.Args[0]) == "prismctl" {
		os.Exit(ctl.Main(version, os.Args[1:]))
	}
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
