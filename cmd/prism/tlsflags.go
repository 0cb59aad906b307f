package main

import (
	"errors"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/mesh/pki"
)

// Environment defaults of the TLS flags, for containers that mount the
// files (the chart sets them).
const (
	envTLSCA   = "PRISM_TLS_CA"
	envTLSCert = "PRISM_TLS_CERT"
	envTLSKey  = "PRISM_TLS_KEY"
)

// tlsFlags are the same four flags on every server command: the files of
// this component's identity, or --insecure to run in plaintext.
type tlsFlags struct {
	files    pki.Files
	insecure bool
}

func (t *tlsFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.files.CA, "tls-ca", envOr(envTLSCA, ""), "PEM trust bundle: the CA certificates peers must chain to (env "+envTLSCA+")")
	fs.StringVar(&t.files.Cert, "tls-cert", envOr(envTLSCert, ""), "PEM certificate with this component's spiffe://<trust-domain>/<role>/<name> identity (env "+envTLSCert+")")
	fs.StringVar(&t.files.Key, "tls-key", envOr(envTLSKey, ""), "PEM private key of --tls-cert (env "+envTLSKey+")")
	fs.BoolVar(&t.insecure, "insecure", false, "serve and dial in plaintext without authentication: anyone who reaches a port can do anything (development only)")
}

// load returns this component's TLS identity, or nil with --insecure after
// a warning; without either it refuses to start, since a plaintext mesh
// must be asked for.
func (t *tlsFlags) load(log *slog.Logger) (*pki.Source, error) {
	anyFile := t.files.CA != "" || t.files.Cert != "" || t.files.Key != ""
	switch {
	case t.insecure && anyFile:
		return nil, errors.New("--insecure and --tls-ca/--tls-cert/--tls-key exclude each other")
	case t.insecure:
		log.Warn("running without TLS (--insecure): connections are plaintext and unauthenticated, anyone who reaches a port can read and change everything")
		return nil, nil
	case !anyFile:
		return nil, errors.New("TLS is required: pass --tls-ca, --tls-cert and --tls-key (or " + envTLSCA + ", " + envTLSCert + ", " + envTLSKey + "); `prism certs` issues them, and --insecure runs in plaintext")
	}
	src, err := pki.Load(t.files, log)
	if err != nil {
		return nil, err
	}
	log.Info("tls identity loaded", "identity", src.Identity().String())
	return src, nil
}
