package main

import "github.com/spf13/cobra"

// subcommands lists every subcommand; each lives in its own file.
func subcommands() []*cobra.Command {
	return []*cobra.Command{
		injectCommand(),
		runnerCommand(),
		devCommand(),
		sidecarCommand(),
		adminCommand(),
		gatewayCommand(),
		certsCommand(),
	}
}
