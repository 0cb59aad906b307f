package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/prism-mesh/prism/mesh/identity"
)

// CA is a self-signed certificate authority for one trust domain: enough
// for `prism dev` and a small install (`prism certs`); a larger one brings
// its own (cert-manager, SPIRE, Vault) and hands Prism the files.
type CA struct {
	TrustDomain string
	Cert        *x509.Certificate
	Key         crypto.Signer
}

// NewCA makes a CA valid from now for validity.
func NewCA(trustDomain string, validity time.Duration) (*CA, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("new CA: trust domain %q: %w", trustDomain, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"Prism"}, CommonName: "Prism CA " + td.Name()},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("new CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{TrustDomain: trustDomain, Cert: cert, Key: key}, nil
}

// LoadCA reads a CA written by WriteFiles.
func LoadCA(trustDomain, certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil {
		return nil, fmt.Errorf("load CA %s: not PEM", certFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certFile, err)
	}
	signer, err := ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA key %s: %w", keyFile, err)
	}
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("load CA %s: key %s is not the certificate's", certFile, keyFile)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("load CA %s: not a CA certificate and signing key", certFile)
	}
	return &CA{TrustDomain: trustDomain, Cert: cert, Key: signer}, nil
}

// CertPEM is the CA certificate, the trust bundle components load.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// WriteFiles writes the CA certificate (0644) and key (0600).
func (ca *CA) WriteFiles(certFile, keyFile string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return err
	}
	return errors.Join(
		writeFile(certFile, ca.CertPEM(), 0o644),
		writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600),
	)
}

// Request is one certificate to issue.
type Request struct {
	Role identity.Role
	Name string
	// Hosts are DNS names and IP addresses added as SANs, for clients that
	// check a host name (browsers, curl, Envoy's default validation).
	Hosts []string
	// NotBefore and NotAfter default to now-1m and now+Validity.
	NotBefore, NotAfter time.Time
	Validity            time.Duration
	// Key is the leaf's key, certified as it is (RSA, ECDSA or Ed25519);
	// nil makes a new ECDSA P-256 key.
	Key crypto.Signer
}

// Issue signs a leaf certificate for r, usable as both server and client
// (every component is both), and returns it and its key (PKCS#8) as PEM.
func (ca *CA) Issue(r Request) (certPEM, keyPEM []byte, err error) {
	id, err := identity.New(ca.TrustDomain, r.Role, r.Name)
	if err != nil {
		return nil, nil, err
	}
	sid, err := id.SPIFFEID()
	if err != nil {
		return nil, nil, err
	}
	key := r.Key
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, nil, err
		}
	}
	now := time.Now()
	if r.NotBefore.IsZero() {
		r.NotBefore = now.Add(-time.Minute)
	}
	if r.NotAfter.IsZero() {
		if r.Validity == 0 {
			r.Validity = 365 * 24 * time.Hour
		}
		r.NotAfter = now.Add(r.Validity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"Prism"}, CommonName: string(r.Role) + "/" + r.Name},
		URIs:         []*url.URL{sid.URL()},
		NotBefore:    r.NotBefore,
		NotAfter:     r.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", id, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// IssueFiles issues r into dir as <role>-<name>.pem and <role>-<name>-key.pem
// beside the bundle ca.pem, and returns the three paths.
func (ca *CA) IssueFiles(dir string, r Request) (Files, error) {
	certPEM, keyPEM, err := ca.Issue(r)
	if err != nil {
		return Files{}, err
	}
	base := filepath.Join(dir, string(r.Role)+"-"+r.Name)
	f := Files{CA: filepath.Join(dir, "ca.pem"), Cert: base + ".pem", Key: base + "-key.pem"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, err
	}
	return f, errors.Join(
		writeFile(f.CA, ca.CertPEM(), 0o644),
		writeFile(f.Cert, certPEM, 0o644),
		writeFile(f.Key, keyPEM, 0o600),
	)
}

// writeFile replaces path in one rename, so a reader never sees half a file.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}

// Directory is a CA and the certificates it issued into one directory, one
// per identity, issued on first use and then reused: the throwaway PKI of a
// test process or a benchmark run.
type Directory struct {
	ca    *CA
	dir   string
	hosts []string

	mu    sync.Mutex
	files map[identity.Identity]Files
}

// NewDirectory makes a CA for trustDomain valid for validity, whose
// certificates go under dir (<dir>/<role>-<name>/) with hosts as their
// host-name SANs.
func NewDirectory(dir, trustDomain string, validity time.Duration, hosts ...string) (*Directory, error) {
	ca, err := NewCA(trustDomain, validity)
	if err != nil {
		return nil, err
	}
	return &Directory{ca: ca, dir: dir, hosts: hosts, files: map[identity.Identity]Files{}}, nil
}

// CA is the directory's certificate authority.
func (d *Directory) CA() *CA { return d.ca }

// Files are role/name's files, issued on first use.
func (d *Directory) Files(role identity.Role, name string) (Files, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := identity.Identity{TrustDomain: d.ca.TrustDomain, Role: role, Name: name}
	if f, ok := d.files[id]; ok {
		return f, nil
	}
	f, err := d.ca.IssueFiles(filepath.Join(d.dir, string(role)+"-"+name), Request{Role: role, Name: name, Hosts: d.hosts})
	if err != nil {
		return Files{}, fmt.Errorf("issue %s: %w", id, err)
	}
	d.files[id] = f
	return f, nil
}
