package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/mesh/pki"
)

func TestGatewayFlagErrors(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	base := gatewayFlags{admin: "127.0.0.1:1", nodeID: "gw", httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0", logLevel: "info", logFormat: "json", tls: tlsFlags{insecure: true}, noQueryAuth: true}
	cases := []struct {
		name string
		mod  func(*gatewayFlags)
		want string
	}{
		{"neither TLS files nor --insecure", func(f *gatewayFlags) { f.tls = tlsFlags{} }, "TLS is required"},
		{"missing TLS files", func(f *gatewayFlags) { f.tls = tlsFlags{files: pki.Files{CA: "/nonexistent/ca.pem"}} }, "tls:"},
		{"no query authentication", func(f *gatewayFlags) { f.noQueryAuth = false }, "query authentication is required"},
		{"token keys and no query auth", func(f *gatewayFlags) { f.jwksFile = "/nonexistent/jwks.json" }, "exclude each other"},
		{"token keys without issuer", func(f *gatewayFlags) { f.noQueryAuth, f.jwksFile = false, "/nonexistent/jwks.json" }, "issuer"},
		{"no admin and no bootstrap env", func(f *gatewayFlags) { f.admin = " , " }, "--admin: required"},
		{"admin without port", func(f *gatewayFlags) { f.admin = "127.0.0.1:1,admin-2" }, `--admin: bootstrap: admin "admin-2"`},
		{"empty node id", func(f *gatewayFlags) { f.nodeID = "" }, "node id is required"},
		{"bad log format", func(f *gatewayFlags) { f.logFormat = "xml" }, "--log-format"},
		{"busy http port", func(f *gatewayFlags) { f.httpAddr = busy.Addr().String() }, "--http-addr"},
		{"busy grpc port", func(f *gatewayFlags) { f.grpcAddr = busy.Addr().String() }, "--grpc-addr"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := base
			tc.mod(&f)
			err := runGateway(context.Background(), &cobra.Command{}, f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
}
