package ctl

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"
)

// clientVersion is this binary's build.
type clientVersion struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// serverVersion is one admin node's build, as it reports it.
type serverVersion struct {
	ID          string `json:"id"`
	GRPCAddress string `json:"grpc_address,omitempty"`
	Version     string `json:"version,omitempty"`
	Error       string `json:"error,omitempty"`
}

func versionCommand(g *globals) *cobra.Command {
	var clientOnly bool
	c := &cobra.Command{
		Use:   "version",
		Short: "Print prismctl's version and every admin node's",
		Long: `Print prismctl's version, then every admin node's as each reports it when
asked directly (within 2s), like kubectl version. --client prints only
prismctl's, without calling the cluster. When no node answers, prismctl's
version is printed and the command fails as any other would.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cv := clientVersion{Version: g.version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
			var (
				servers []serverVersion
				err     error
			)
			if !clientOnly {
				var ms []memberStatus
				ms, err = members(cmd, g)
				for _, m := range ms {
					servers = append(servers, serverVersion{ID: m.ID, GRPCAddress: m.GRPCAddress, Version: m.Version, Error: m.Error})
				}
			}
			if oerr := emit(cmd, g, struct {
				Client  clientVersion   `json:"client"`
				Servers []serverVersion `json:"servers,omitempty"`
			}{cv, servers}, func(w io.Writer) {
				fmt.Fprintf(w, "client\t%s\t(%s, %s)\n", cv.Version, cv.GoVersion, cv.Platform)
				for _, s := range servers {
					v := orDash(s.Version)
					if s.Version == "" && s.Error != "" {
						v = "? (" + s.Error + ")"
					}
					fmt.Fprintf(w, "admin %s\t%s\t(%s)\n", s.ID, v, orDash(s.GRPCAddress))
				}
			}); oerr != nil {
				return oerr
			}
			return err
		},
	}
	c.Flags().BoolVar(&clientOnly, "client", false, "print only prismctl's version; do not call the cluster")
	return c
}
