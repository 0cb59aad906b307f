// Command prismctl administers a Prism admin cluster.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// version is set by -ldflags at release time.
var version = "dev"

func main() {
	if err := rootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prismctl:", err)
		os.Exit(1)
	}
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
	root.AddCommand(
		clusterCommand(g),
		namespaceCommand(g),
		proxyCommand(g),
		leaseCommand(g),
		routeCommand(g),
		memberCommand(g),
	)
	return root
}
