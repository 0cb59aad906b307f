// Package pki loads a component's certificate, key and trust bundle from PEM
// files, reloads them when the files change, and builds the mutual TLS
// configurations every Prism connection uses (TLS 1.3, client certificates
// required, peers verified against the bundle and named by their SPIFFE
// identity rather than a host name). It also holds the small CA that
// `prism dev` and `prism certs` issue certificates with.
package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/prism-mesh/prism/mesh/identity"
)

// Files names the PEM files of one identity: the trust bundle (one or more
// CA certificates; during a CA rotation both), the certificate chain (leaf
// first) and its private key.
type Files struct {
	CA, Cert, Key string
}

// Source serves the current certificate and bundle of Files. Every handshake
// asks it, and it re-reads the files (a few KiB; a handshake costs far more)
// and parses them again when their bytes changed, so a rotated certificate or CA is used by the next connection
// without a restart. A change that does not parse (a half-written pair) is
// logged and the previous certificate kept.
type Source struct {
	files Files
	log   *slog.Logger

	mu     sync.Mutex
	raw    [3]string
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
	self   identity.Identity
}

// Load reads files and fails when they do not make one valid identity.
func Load(files Files, log *slog.Logger) (*Source, error) {
	if files.CA == "" || files.Cert == "" || files.Key == "" {
		return nil, fmt.Errorf("tls: the CA bundle, certificate and key files are all required (have %+v)", files)
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Source{files: files, log: log}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Identity is this component's own identity, from its certificate.
func (s *Source) Identity() identity.Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshLocked()
	return s.self
}

// GetX509SVID is the current certificate (x509svid.Source).
func (s *Source) GetX509SVID() (*x509svid.SVID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshLocked()
	return s.svid, nil
}

// GetX509BundleForTrustDomain is the current bundle (x509bundle.Source); a
// peer from another trust domain has none.
func (s *Source) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshLocked()
	if td != s.bundle.TrustDomain() {
		return nil, fmt.Errorf("tls: no trust bundle for trust domain %q (this component trusts %q)", td, s.bundle.TrustDomain())
	}
	return s.bundle, nil
}

// Files are the files this source reads.
func (s *Source) Files() Files { return s.files }

func (s *Source) refreshLocked() {
	raw, err := s.read()
	if err == nil && raw == s.raw {
		return
	}
	if err == nil {
		err = s.parseLocked(raw)
	}
	if err != nil {
		s.log.Warn("tls files changed but do not load; keeping the previous certificate", "err", err,
			"cert", s.files.Cert, "ca", s.files.CA)
		return
	}
	s.log.Info("tls files reloaded", "identity", s.self.String(), "cert", s.files.Cert, "ca", s.files.CA)
}

func (s *Source) read() ([3]string, error) {
	var out [3]string
	for i, p := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		b, err := os.ReadFile(p)
		if err != nil {
			return out, fmt.Errorf("tls: %w", err)
		}
		out[i] = string(b)
	}
	return out, nil
}

func (s *Source) reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, err := s.read()
	if err != nil {
		return err
	}
	return s.parseLocked(raw)
}

// parseLocked installs raw (CA bundle, certificate, key) if it is one valid
// identity whose certificate the bundle verifies. The key may be in any
// encoding ParsePrivateKey reads; go-spiffe then checks the leaf (an SVID,
// not a CA) and that the key is the leaf's.
func (s *Source) parseLocked(raw [3]string) error {
	key, err := ParsePrivateKey([]byte(raw[2]))
	if err != nil {
		return fmt.Errorf("tls: load %s: %w", s.files.Key, err)
	}
	keyPEM, err := pkcs8PEM(key)
	if err != nil {
		return fmt.Errorf("tls: load %s: %w", s.files.Key, err)
	}
	svid, err := x509svid.Parse([]byte(raw[1]), keyPEM)
	if err != nil {
		return fmt.Errorf("tls: load %s and %s: %w", s.files.Cert, s.files.Key, err)
	}
	self, err := identity.FromCert(svid.Certificates[0])
	if err != nil {
		return fmt.Errorf("tls: %s: %w", s.files.Cert, err)
	}
	bundle, err := x509bundle.Parse(svid.ID.TrustDomain(), []byte(raw[0]))
	if err != nil {
		return fmt.Errorf("tls: CA bundle %s: %w", s.files.CA, err)
	}
	if _, err := svid.Certificates[0].Verify(x509.VerifyOptions{
		Roots: poolOf(bundle), Intermediates: poolOf(nil, svid.Certificates[1:]...),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return fmt.Errorf("tls: %s is not signed by a CA in %s: %w", s.files.Cert, s.files.CA, err)
	}
	s.svid, s.bundle, s.self, s.raw = svid, bundle, self, raw
	return nil
}

func poolOf(b *x509bundle.Bundle, certs ...*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	if b != nil {
		certs = append(certs, b.X509Authorities()...)
	}
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

// Authorizer decides whether a verified peer may connect at all; per-call
// rules come after, from the identity (identity.Policy).
type Authorizer func(identity.Identity) error

// Any accepts every identity of the trust domain.
func Any(identity.Identity) error { return nil }

// RoleIs accepts only the roles given.
func RoleIs(roles ...identity.Role) Authorizer {
	return func(id identity.Identity) error {
		for _, r := range roles {
			if id.Role == r {
				return nil
			}
		}
		return fmt.Errorf("peer %s: role %s is not one of %v", id, id.Role, roles)
	}
}

// Exactly accepts one identity.
func Exactly(want identity.Identity) Authorizer {
	return func(id identity.Identity) error {
		if id == want {
			return nil
		}
		return fmt.Errorf("peer %s is not %s", id, want)
	}
}

func (s *Source) adapt(auth Authorizer) tlsconfig.Authorizer {
	return func(sid spiffeid.ID, _ [][]*x509.Certificate) error {
		id, err := identity.Parse(sid.String())
		if err != nil {
			return err
		}
		if auth == nil {
			return nil
		}
		return auth(id)
	}
}

// ServerConfig is a TLS 1.3 server configuration that requires a client
// certificate from the bundle's CA with an identity auth accepts.
func (s *Source) ServerConfig(auth Authorizer) *tls.Config {
	c := tlsconfig.MTLSServerConfig(s, s, s.adapt(auth))
	c.MinVersion = tls.VersionTLS13
	return c
}

// ClientConfig is a TLS 1.3 client configuration that presents this
// identity and accepts a server from the bundle's CA whose identity auth
// accepts (no host name check: the identity is the name).
func (s *Source) ClientConfig(auth Authorizer) *tls.Config {
	c := tlsconfig.MTLSClientConfig(s, s, s.adapt(auth))
	c.MinVersion = tls.VersionTLS13
	return c
}
