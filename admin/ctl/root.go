// Package ctl is prismctl, the command line that administers a Prism admin
// cluster through its gRPC API (admin/client). It is a package rather than
// cmd/prismctl's main so that prism runs it too when invoked as prismctl (the
// image ships one binary and prismctl as a link to it: two binaries would
// hold nearly the same code twice); cmd/prismctl stays a standalone build.
package ctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/admin/client"
)

// Main runs prismctl with args (the command line after the program's name)
// and returns its exit status (exitCodesHelp). version is the build's, as the
// calling main was stamped (-X main.version).
func Main(version string, args []string) int {
	root := rootCommand(version)
	root.SetArgs(args)
	return exit(root.Execute(), os.Stderr)
}

// usageError is a command line prismctl cannot run as written: an unknown
// command or flag, the wrong arguments or a flag's value it cannot use. It
// exits 2 (exitUsage).
type usageError struct {
	cmd *cobra.Command
	err error
}

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

// exit reports err on stderr and returns the exit status it stands for
// (exitCodesHelp).
func exit(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "prismctl: %v\nRun '%s --help' for usage.\n", ue.err, ue.cmd.CommandPath())
		return exitUsage
	}
	fmt.Fprintln(stderr, "prismctl:", err)
	return exitCode(err)
}

// defaultAdmin is where prism dev serves the admin API and the chart's
// admin pods listen (admin.ports.grpc).
const defaultAdmin = "127.0.0.1:7001"

// unreachableAfter is how long prismctl keeps trying while no admin node
// accepts a connection: long enough for a node that is restarting on the
// spot, short enough that a wrong address is reported at once.
const unreachableAfter = 1500 * time.Millisecond

func rootCommand(version string) *cobra.Command {
	g := &globals{version: version}
	root := &cobra.Command{
		Use:   "prismctl",
		Short: "Administer a Prism mailbox mesh admin cluster",
		Long: `Administer a Prism mailbox mesh admin cluster.

prismctl calls the admin nodes' gRPC API at --admin (any node will do; it
goes round them while there is no leader, until --timeout), as the identity
--cacert/--cert/--key name, else the PRISMCTL_* variables, else the config
file prism dev writes (` + client.EnvConfig + `). When no node accepts a
connection it gives up within 2s and says where it looked.

` + exitCodesHelp,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(formats, g.format) {
				return &usageError{cmd, fmt.Errorf("-o/--output: %q is not one of %s", g.format, strings.Join(formats, ", "))}
			}
			return nil
		},
	}
	defAdmin := os.Getenv(envAdmin)
	if defAdmin == "" {
		defAdmin = defaultAdmin
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.admin, "admin", defAdmin, "admin gRPC endpoints, host:port,host:port,... (env "+envAdmin+"; default: the config file's, else where prism dev and the chart serve it); any node will do")
	pf.StringVarP(&g.format, "output", "o", "table", "output format: table, wide (more columns), json or yaml (the HTTP API's field names: snake_case, numbers as numbers)")
	pf.StringVar(&g.format, "format", "table", "the same as -o/--output (kept for scripts that use it)")
	pf.DurationVar(&g.timeout, "timeout", 15*time.Second, "overall deadline, retries included (a list's: each page's)")
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
		versionCommand(g),
	)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{c, err} })
	markUsageErrors(root)
	hintUnreachable(root, g)
	return root
}

// hintUnreachable adds to the error of every command that could reach no
// admin node which addresses it tried, where they came from and how to
// point it elsewhere.
func hintUnreachable(c *cobra.Command, g *globals) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			if !client.Unreachable(err) {
				return err
			}
			return fmt.Errorf("%w\nhint: no admin node accepted a connection at %s (%s): is prism admin (or prism dev) running there? Point prismctl at it with --admin host:port,... or %s",
				err, g.admin, g.adminSource(cmd), envAdmin)
		}
	}
	for _, sub := range c.Commands() {
		hintUnreachable(sub, g)
	}
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
