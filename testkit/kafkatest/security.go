package kafkatest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms kfake serves, by their Kafka names.
const (
	Plain       = "PLAIN"
	ScramSHA256 = "SCRAM-SHA-256"
	ScramSHA512 = "SCRAM-SHA-512"
)

// certValidFor outlasts any test run.
const certValidFor = 24 * time.Hour

// TLSFiles are PEM files of a TLS cluster's throwaway CA: the bundle clients trust, and a client certificate
// and key it signed (a broker started with RequireClientCert accepts only those).
type TLSFiles struct {
	CA, ClientCert, ClientKey string
}

type tlsOption struct {
	requireClientCert bool
}

func (o *tlsOption) apply(st *settings) { st.tls = o }

// TLS serves the broker over TLS only, with a certificate for 127.0.0.1, ::1 and localhost from a throwaway
// CA whose files Cluster.TLS names.
func TLS() Option { return &tlsOption{} }

// MutualTLS is TLS with client certificates required: the broker accepts only clients presenting a
// certificate from its CA (Cluster.TLS.ClientCert).
func MutualTLS() Option { return &tlsOption{requireClientCert: true} }

type saslOption struct{ mechanism, user, password string }

func (o saslOption) apply(st *settings) {
	st.kfake = append(st.kfake, kfake.EnableSASL(), kfake.Superuser(o.mechanism, o.user, o.password))
	switch o.mechanism {
	case ScramSHA256:
		st.sasl = append(st.sasl, scram.Auth{User: o.user, Pass: o.password}.AsSha256Mechanism())
	case ScramSHA512:
		st.sasl = append(st.sasl, scram.Auth{User: o.user, Pass: o.password}.AsSha512Mechanism())
	default:
		st.sasl = append(st.sasl, plain.Auth{User: o.user, Pass: o.password}.AsMechanism())
	}
}

// SASL requires every connection to authenticate and adds user with password under mechanism (Plain,
// ScramSHA256 or ScramSHA512); give it once per user. The helpers authenticate as the first user.
func SASL(mechanism, user, password string) Option { return saslOption{mechanism, user, password} }

// build issues the CA, the broker's and a client's certificates, writes the CA and the client's to files,
// and returns the broker's listener config and the helpers' client config.
func (o *tlsOption) build(t testing.TB) (server, client *tls.Config, files *TLSFiles) {
	t.Helper()
	caKey, caCert := issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "kafkatest CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	srvKey, srvCert := issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "kafkatest broker"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, caCert, caKey)
	cliKey, cliCert := issue(t, &x509.Certificate{
		Subject:  pkix.Name{CommonName: "kafkatest client"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, caKey)

	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	server = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey, Leaf: srvCert}},
	}
	if o.requireClientCert {
		server.ClientAuth, server.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: pool,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cliCert.Raw}, PrivateKey: cliKey, Leaf: cliCert}},
	}

	dir := t.TempDir()
	files = &TLSFiles{
		CA:         filepath.Join(dir, "ca.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	cliKeyDER, err := x509.MarshalPKCS8PrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, files.CA, "CERTIFICATE", caCert.Raw)
	writePEM(t, files.ClientCert, "CERTIFICATE", cliCert.Raw)
	writePEM(t, files.ClientKey, "PRIVATE KEY", cliKeyDER)
	return server, client, files
}

// issue signs tmpl with parent's key (itself when parent is nil) for a new P-256 key.
func issue(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(certValidFor)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
