package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// certs is a small install's certificate authority, like `consul tls`:
// one CA in a directory and a certificate per component. Larger installs
// issue the same identities from cert-manager, SPIRE or Vault.
func certsCommand() *cobra.Command {
	var dir, trustDomain string
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create a CA and issue the mTLS certificates of a small install",
		Long: `certs keeps a CA in --dir (ca.pem, ca-key.pem) and issues certificates with the
SPIFFE identity every Prism component presents, spiffe://<trust-domain>/<role>/<name>:
  admin/<node-id>     a prism admin node
  proxy/<proxy-id>    a sidecar and its runner (both load the same files)
  gateway/<name>      prism gateway or Envoy
  operator/<name>     prismctl, for writes
  reader/<name>       read-only prismctl and dashboards
Each component is then started with --tls-ca ca.pem --tls-cert <role>-<name>.pem
--tls-key <role>-<name>-key.pem. See docs/security.md.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "prism-pki", "directory of the CA and the issued certificates")
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create the CA (refuses to replace an existing one)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ca, err := initCA(dir, trustDomain, 10*365*24*time.Hour)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA for trust domain %s in %s (ca.pem is the trust bundle, keep ca-key.pem secret)\n", ca.TrustDomain, dir)
			return nil
		},
	}
	initCmd.Flags().StringVar(&trustDomain, "trust-domain", identity.DefaultTrustDomain, "the trust domain of every identity this CA issues")
	var (
		hosts    []string
		validity time.Duration
	)
	issue := &cobra.Command{
		Use:   "issue ROLE NAME",
		Short: "Issue a certificate for role/name into --dir as <role>-<name>.pem and <role>-<name>-key.pem",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := loadCA(dir)
			if err != nil {
				return err
			}
			f, err := ca.IssueFiles(dir, pki.Request{Role: identity.Role(args[0]), Name: args[1], Hosts: hosts, Validity: validity})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "--tls-ca %s --tls-cert %s --tls-key %s\n", f.CA, f.Cert, f.Key)
			return nil
		},
	}
	issue.Flags().StringSliceVar(&hosts, "host", nil, "DNS names and IPs to add as SANs, for clients that check a host name (curl, Envoy's default validation)")
	issue.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the certificate is valid")
	cmd.AddCommand(initCmd, issue)
	return cmd
}

// caFiles are the CA's certificate and key in dir; trust-domain records the
// trust domain beside them, since a CA certificate carries none.
func caFiles(dir string) (cert, key, td string) {
	return filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"), filepath.Join(dir, "trust-domain")
}

func initCA(dir, trustDomain string, validity time.Duration) (*pki.CA, error) {
	certFile, keyFile, tdFile := caFiles(dir)
	if _, err := os.Stat(keyFile); err == nil {
		return nil, fmt.Errorf("certs init: %s exists; remove it to make a new CA (every certificate it issued stops being trusted)", keyFile)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ca, err := pki.NewCA(trustDomain, validity)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(tdFile, []byte(trustDomain+"\n"), 0o644); err != nil {
		return nil, err
	}
	return ca, ca.WriteFiles(certFile, keyFile)
}

func loadCA(dir string) (*pki.CA, error) {
	certFile, keyFile, tdFile := caFiles(dir)
	td, err := os.ReadFile(tdFile)
	if err != nil {
		return nil, fmt.Errorf("certs: no CA in %s (run prism certs init --dir %s): %w", dir, dir, err)
	}
	return pki.LoadCA(strings.TrimSpace(string(td)), certFile, keyFile)
}
