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
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/mesh/pki/kube"
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
	cmd.AddCommand(initCmd, issue, kubeSecretsCommand(kubeSecrets))
	return cmd
}

// kubeSecrets is namespace's Secrets through kubeconfig, or through the
// pod's own service account when it is empty.
func kubeSecrets(kubeconfig, namespace string) (kube.SecretClient, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return kube.NewSecrets(cfg, namespace)
}

// kubeSecretsCommand is the chart's tls.mode generate: run by a Helm hook
// Job before every install and upgrade, it keeps the Secrets the pods mount
// in secret mode, issued from a CA it makes once. Names come from the chart
// as flags rather than being derived here from a release name, so that the
// chart alone decides them.
func kubeSecretsCommand(newSecrets func(kubeconfig, namespace string) (kube.SecretClient, error)) *cobra.Command {
	var (
		kubeconfig string
		p          kube.Plan
		admins     = statefulSetFlags{role: identity.Admin, flag: "admin"}
		runners    = statefulSetFlags{role: identity.Proxy, flag: "runner"}
		gateway    = singleFlags{role: identity.Gateway, flag: "gateway"}
		operator   = singleFlags{role: identity.Operator, flag: "operator"}
	)
	cmd := &cobra.Command{
		Use:   "kube-secrets",
		Short: "Keep the mesh's certificates in Kubernetes Secrets, from a CA made once (the chart's tls.mode generate)",
		Long: `kube-secrets makes a CA into --ca-secret unless that Secret exists (so it is made once
and survives upgrades; its key stays in that Secret), then creates or updates:
  --admin-secret     ca.crt and <pod>.crt/.key for admin/<pod>, pods <admin-statefulset>-0..N-1
  --runner-secret    ca.crt and <pod>.crt/.key for proxy/<pod>, pods <runner-statefulset>-0..M-1
                     (a runner's proxy id is its pod name)
  --gateway-secret   ca.crt, tls.crt, tls.key for gateway/<gateway-name>
  --operator-secret  ca.crt, tls.crt, tls.key for operator/<operator-name>
A certificate from the CA with its identity and more than a third of its validity
left is kept, so a second run changes nothing; pods added by a scale-up get theirs
on the next run. Secrets it did not make (label ` + kube.LabelKey + `=` + kube.LabelSelf + `) are refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p.Secrets = nil
			for _, g := range []interface {
				secret() (kube.Secret, bool, error)
			}{admins, runners, gateway, operator} {
				s, ok, err := g.secret()
				if err != nil {
					return err
				}
				if ok {
					p.Secrets = append(p.Secrets, s)
				}
			}
			if p.Namespace == "" || p.CASecret == "" {
				return errors.New("certs kube-secrets: --namespace and --ca-secret are required")
			}
			secrets, err := newSecrets(kubeconfig, p.Namespace)
			if err != nil {
				return err
			}
			res, err := kube.Sync(cmd.Context(), secrets, p)
			if err != nil {
				return fmt.Errorf("certs kube-secrets: %w", err)
			}
			out := cmd.OutOrStdout()
			if res.CACreated {
				fmt.Fprintf(out, "made the CA in Secret %s/%s\n", p.Namespace, p.CASecret)
			}
			for _, s := range res.Issued {
				fmt.Fprintf(out, "issued %s\n", s)
			}
			fmt.Fprintf(out, "%d certificates issued, %d kept\n", len(res.Issued), res.Kept)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the pod's service account")
	f.StringVar(&p.Namespace, "namespace", "", "namespace of the Secrets")
	f.StringVar(&p.CASecret, "ca-secret", "", "Secret of the CA: read if it exists, else made")
	f.StringVar(&p.TrustDomain, "trust-domain", identity.DefaultTrustDomain, "the trust domain of every identity")
	f.DurationVar(&p.Validity, "validity", 365*24*time.Hour, "validity of each certificate; one with a third or less left is issued again")
	f.DurationVar(&p.CAValidity, "ca-validity", 10*365*24*time.Hour, "validity of the CA when it is made")
	f.StringToStringVar(&p.Labels, "label", nil, "label of every Secret made, key=value (repeatable)")
	admins.register(f)
	runners.register(f)
	gateway.register(f)
	operator.register(f)
	return cmd
}

// statefulSetFlags name a Secret holding one identity per pod of a
// StatefulSet, keyed by pod name.
type statefulSetFlags struct {
	secretName, statefulSet string
	replicas                int
	role                    identity.Role
	flag                    string // the flags' prefix
}

func (s *statefulSetFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.secretName, s.flag+"-secret", "", "Secret of the "+s.flag+" pods' certificates; empty: none")
	f.StringVar(&s.statefulSet, s.flag+"-statefulset", "", "StatefulSet of the "+s.flag+" pods, whose names are <statefulset>-<ordinal>")
	f.IntVar(&s.replicas, s.flag+"-replicas", 0, "number of "+s.flag+" pods (0: the Secret holds only ca.crt)")
}

func (s statefulSetFlags) secret() (kube.Secret, bool, error) {
	if s.secretName == "" {
		return kube.Secret{}, false, nil
	}
	if s.statefulSet == "" || s.replicas < 0 {
		return kube.Secret{}, false, fmt.Errorf("certs kube-secrets: --%[1]s-secret needs --%[1]s-statefulset and a --%[1]s-replicas not below 0", s.flag)
	}
	out := kube.Secret{Name: s.secretName}
	for i := range s.replicas {
		pod := fmt.Sprintf("%s-%d", s.statefulSet, i)
		out.Identities = append(out.Identities, kube.Identity{Role: s.role, Name: pod, File: pod})
	}
	return out, true, nil
}

// singleFlags name a Secret holding one identity as tls.crt and tls.key.
type singleFlags struct {
	secretName, name string
	role             identity.Role
	flag             string
}

func (s *singleFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.secretName, s.flag+"-secret", "", "Secret of the "+s.flag+" certificate; empty: none")
	f.StringVar(&s.name, s.flag+"-name", "", "the name in the "+s.flag+"/<name> identity")
}

func (s singleFlags) secret() (kube.Secret, bool, error) {
	if s.secretName == "" {
		return kube.Secret{}, false, nil
	}
	if s.name == "" {
		return kube.Secret{}, false, fmt.Errorf("certs kube-secrets: --%[1]s-secret needs --%[1]s-name", s.flag)
	}
	return kube.Secret{Name: s.secretName, Identities: []kube.Identity{{Role: s.role, Name: s.name, File: kube.FileTLS}}}, true, nil
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
