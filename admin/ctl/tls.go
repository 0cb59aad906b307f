package ctl

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Where prismctl finds its identity, like etcdctl: flags, then PRISMCTL_*
// variables, then the config file (client.ConfigPath) that `prism dev`
// writes for its throwaway CA.
const (
	envCACert   = "PRISMCTL_CACERT"
	envCert     = "PRISMCTL_CERT"
	envKey      = "PRISMCTL_KEY"
	envInsecure = "PRISMCTL_INSECURE"
)

type tlsOptions struct {
	files    pki.Files
	insecure bool
}

func (o *tlsOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.files.CA, "cacert", os.Getenv(envCACert), "PEM bundle of the CA the admin nodes' certificates chain to (env "+envCACert+")")
	fs.StringVar(&o.files.Cert, "cert", os.Getenv(envCert), "PEM client certificate, an operator/<name> or reader/<name> identity (env "+envCert+")")
	fs.StringVar(&o.files.Key, "key", os.Getenv(envKey), "PEM private key of --cert (env "+envKey+")")
	fs.BoolVar(&o.insecure, "insecure", os.Getenv(envInsecure) == "true", "talk plaintext to admin nodes started with --insecure (env "+envInsecure+"=true)")
}

// usesConfigFile reports whether prismctl calls the config file's admin
// with its identity: only then are its Kafka brokers that admin's, and not
// those of a prism dev the user pointed prismctl away from.
func (g *globals) usesConfigFile(cmd *cobra.Command) bool {
	if g.tls.insecure || g.tls.files != (pki.Files{}) {
		return false
	}
	if !g.adminSet(cmd) {
		return true
	}
	c, ok, err := g.fileConfig()
	return err == nil && ok && c.Admin == g.admin
}

// resolve fills what flags and variables left empty from the config file
// and loads the identity; nil means plaintext (--insecure).
func (g *globals) resolve(adminSet bool) (*pki.Source, error) {
	o := &g.tls
	anyFile := o.files != (pki.Files{})
	if o.insecure {
		if anyFile {
			return nil, errors.New("--insecure and --cacert/--cert/--key exclude each other")
		}
		return nil, nil
	}
	if !anyFile {
		c, ok, err := g.fileConfig()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("TLS is required: pass --cacert, --cert and --key (or %s, %s, %s), or write them to %s; --insecure talks plaintext", envCACert, envCert, envKey, client.ConfigPath())
		}
		o.files = pki.Files{CA: c.CACert, Cert: c.Cert, Key: c.Key}
		if !adminSet && c.Admin != "" {
			g.admin, g.configPath = c.Admin, client.ConfigPath()
		}
	}
	return pki.Load(o.files, nil)
}
