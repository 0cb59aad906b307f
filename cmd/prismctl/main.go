// Command prismctl administers a Prism admin cluster.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	os.Exit(exit(rootCommand().Execute(), os.Stderr))
}

// usageError is a command line prismctl cannot run as written: an unknown
// command or flag, or the wrong arguments. It exits 2, every other failure 1,
// so a script can tell its own mistake from the cluster's answer.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

// exit reports err on stderr and returns the exit status it stands for.
func exit(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "prismctl: %v\nRun '%s --help' for usage.\n", ue.err, ue.cmd.CommandPath())
		return 2
	}
	fmt.Fprintln(stderr, "prismctl:", err)
	return 1
}

func rootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "prismctl",
		Short:         "Administer a Prism mailbox mesh admin cluster",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	defAdmin := os.Getenv("PRISM_ADMIN")
	if defAdmin == "" {
		defAdmin = "127.0.0.1:8981"
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.admin, "admin", defAdmin, "admin gRPC endpoints, host:port,host:port,... (env PRISM_ADMIN); any node will do")
	pf.StringVar(&g.format, "format", "table", "output format: table or json")
	pf.DurationVar(&g.timeout, "timeout", 15*time.Second, "overall deadline, retries included")
	pf.DurationVar(&g.attempt, "attempt-timeout", 3*time.Second, "deadline of one call on one endpoint")
	g.tls.register(pf)
	root.AddCommand(
		clusterCommand(g),
		namespaceCommand(g),
		proxyCommand(g),
		leaseCommand(g),
		sessionCommand(g),
		routeCommand(g),
		memberCommand(g),
		snapshotCommand(g),
		moveCommand(g),
	)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{c, err} })
	markUsageErrors(root)
	return root
}

// markUsageErrors makes every argument check of c and its subcommands a
// usageError. A command that only groups others runs its help when named
// alone, and refuses any argument: cobra would otherwise print the help and
// succeed for "prismctl lease get x", a typo that must not pass for success.
func markUsageErrors(c *cobra.Command) {
	if !c.Runnable() && c.HasSubCommands() {
		c.Args = cobra.NoArgs
		c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	}
	if check := c.Args; check != nil {
		c.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return &usageError{c, err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}
