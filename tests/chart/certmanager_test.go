package chart

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/helm/chartrender"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// The stand-ins for cert-manager and its csi-driver write what the real ones write when a request leaves a
// field out, so a chart that forgets one fails here as it would in a cluster: csi-driver
// (github.com/cert-manager/csi-driver pkg/apis/v1alpha1 and its defaults) makes an RSA 2048 key written as
// PKCS#1, files tls.crt, tls.key and ca.crt, a 2160h certificate, and fills in ${POD_NAME},
// ${POD_NAMESPACE}, ${POD_UID} and ${SERVICE_ACCOUNT_NAME}; a cert-manager Certificate's privateKey defaults
// to RSA (2048; ECDSA 256) encoded PKCS#1, which for ECDSA is SEC1 ("EC PRIVATE KEY"), Ed25519 always PKCS#8.
const (
	csiDefaultDuration = 2160 * time.Hour
	csiAttr            = "csi.cert-manager.io/"
)

// keySpec is a requested private key: algorithm RSA, ECDSA or Ed25519, size in bits, encoding PKCS1 or PKCS8.
type keySpec struct {
	algorithm string
	size      int
	encoding  string
}

// withDefaults fills in what cert-manager and csi-driver do for fields left out.
func (k keySpec) withDefaults(t testing.TB) keySpec {
	t.Helper()
	if k.algorithm == "" {
		k.algorithm = "RSA"
	}
	if k.size == 0 {
		switch k.algorithm {
		case "RSA":
			k.size = 2048
		case "ECDSA":
			k.size = 256
		}
	}
	if k.encoding == "" {
		k.encoding = "PKCS1"
	}
	if k.encoding != "PKCS1" && k.encoding != "PKCS8" {
		t.Fatalf("key encoding %q: cert-manager takes PKCS1 or PKCS8", k.encoding)
	}
	return k
}

// generate makes the key and its PEM as cert-manager encodes it.
func (k keySpec) generate(t testing.TB) (crypto.Signer, []byte) {
	t.Helper()
	var (
		key crypto.Signer
		err error
	)
	switch k.algorithm {
	case "RSA":
		key, err = rsa.GenerateKey(rand.Reader, k.size)
	case "ECDSA":
		curve := map[int]elliptic.Curve{256: elliptic.P256(), 384: elliptic.P384(), 521: elliptic.P521()}[k.size]
		if curve == nil {
			t.Fatalf("ECDSA key size %d: cert-manager takes 256, 384 or 521", k.size)
		}
		key, err = ecdsa.GenerateKey(curve, rand.Reader)
	case "Ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("key algorithm %q: cert-manager takes RSA, ECDSA or Ed25519", k.algorithm)
	}
	must(t, err)
	var block *pem.Block
	switch {
	case k.encoding == "PKCS8" || k.algorithm == "Ed25519":
		der, err := x509.MarshalPKCS8PrivateKey(key)
		must(t, err)
		block = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
	case k.algorithm == "RSA":
		block = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key.(*rsa.PrivateKey))}
	default:
		der, err := x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
		must(t, err)
		block = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	}
	return key, pem.EncodeToMemory(block)
}

// issueKey is a certificate for role/name of the key spec asks for, valid for validity, and that key's PEM.
func (c *cluster) issueKey(role identity.Role, name string, spec keySpec, validity time.Duration) (crt, key []byte) {
	c.t.Helper()
	signer, keyPEM := spec.withDefaults(c.t).generate(c.t)
	crt, _, err := c.ca.Issue(pki.Request{Role: role, Name: name, Key: signer, Validity: validity})
	if err != nil {
		c.t.Fatalf("issue %s/%s: %v", role, name, err)
	}
	return crt, keyPEM
}

// csiPodVars are the variables csi-driver fills in for the pod.
func csiPodVars(p *pod) map[string]string {
	return map[string]string{"POD_NAME": p.name, "POD_NAMESPACE": namespace, "POD_UID": "7c4f1e9a-" + p.name, "SERVICE_ACCOUNT_NAME": p.spec.ServiceAccountName}
}

// csiFiles are the files csi-driver writes into a volume with attrs for pod p, by file name, and the identity
// it asked for.
func (c *cluster) csiFiles(p *pod, attrs map[string]string) (map[string][]byte, identity.Identity) {
	c.t.Helper()
	vars := csiPodVars(p)
	uri := attrs[csiAttr+"uri-sans"]
	for k, v := range vars {
		uri = strings.ReplaceAll(uri, "${"+k+"}", v)
	}
	id, err := identity.Parse(uri)
	if err != nil {
		c.t.Fatalf("pod %s: csi uri-sans %q: %v", p.name, attrs[csiAttr+"uri-sans"], err)
	}
	if id.TrustDomain != c.ca.TrustDomain {
		c.t.Fatalf("pod %s asks for %s, outside the trust domain %s", p.name, uri, c.ca.TrustDomain)
	}
	spec := keySpec{algorithm: attrs[csiAttr+"key-algorithm"], encoding: attrs[csiAttr+"key-encoding"]}
	if s, ok := attrs[csiAttr+"key-size"]; ok {
		n, err := strconv.Atoi(s)
		if err != nil {
			c.t.Fatalf("pod %s: csi key-size %q: %v", p.name, s, err)
		}
		spec.size = n
	}
	validity := csiDefaultDuration
	if d, ok := attrs[csiAttr+"duration"]; ok {
		if validity, err = time.ParseDuration(d); err != nil {
			c.t.Fatalf("pod %s: csi duration %q: %v", p.name, d, err)
		}
	}
	name := func(attr, def string) string {
		if v, ok := attrs[csiAttr+attr]; ok {
			return v
		}
		return def
	}
	crt, key := c.issueKey(id.Role, id.Name, spec, validity)
	return map[string][]byte{
		name("ca-file", "ca.crt"):           c.caPEM(),
		name("certificate-file", "tls.crt"): crt,
		name("privatekey-file", "tls.key"):  key,
	}, id
}

// certificateFiles are the Secret data cert-manager writes for a Certificate: ca.crt, tls.crt, tls.key.
func (c *cluster) certificateFiles(crt *chartrender.Certificate) map[string][]byte {
	c.t.Helper()
	if len(crt.Spec.URIs) != 1 {
		c.t.Fatalf("Certificate %s: uris %v, want one SPIFFE id", crt.Metadata.Name, crt.Spec.URIs)
	}
	id, err := identity.Parse(crt.Spec.URIs[0])
	must(c.t, err)
	validity := 90 * 24 * time.Hour // cert-manager's default duration
	if crt.Spec.Duration != "" {
		validity, err = time.ParseDuration(crt.Spec.Duration)
		must(c.t, err)
	}
	k := crt.Spec.PrivateKey
	cert, key := c.issueKey(id.Role, id.Name, keySpec{algorithm: k.Algorithm, size: k.Size, encoding: k.Encoding}, validity)
	return map[string][]byte{"ca.crt": c.caPEM(), "tls.crt": cert, "tls.key": key}
}

// TestStandInsWriteTheRealDefaults: a csi volume or Certificate naming no key gets what the real cert-manager
// writes, an RSA 2048 key as PKCS#1 (ECDSA named without an encoding: SEC1), files tls.crt, tls.key and
// ca.crt, 2160h, ${POD_NAME} filled in; and the chart's own requests name ECDSA P-256 as PKCS#8.
func TestStandInsWriteTheRealDefaults(t *testing.T) {
	t.Parallel()
	c := &cluster{t: t}
	ca, err := pki.NewCA("prism.local", time.Hour)
	must(t, err)
	c.ca = ca
	p := &pod{name: "prism-admin-0"}
	began := time.Now()
	files, id := c.csiFiles(p, map[string]string{csiAttr + "uri-sans": "spiffe://prism.local/admin/${POD_NAME}"})
	if id.Name != "prism-admin-0" {
		t.Errorf("identity %v: ${POD_NAME} not filled in", id)
	}
	block, _ := pem.Decode(files["tls.key"])
	if block == nil || block.Type != "RSA PRIVATE KEY" {
		t.Fatalf("default key %v, want RSA PRIVATE KEY (PKCS#1)", block)
	}
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil || key.N.BitLen() != 2048 {
		t.Fatalf("default key: %v, %d bits", err, key.N.BitLen())
	}
	cb, _ := pem.Decode(files["tls.crt"])
	leaf, err := x509.ParseCertificate(cb.Bytes)
	must(t, err)
	if got := leaf.NotAfter.Sub(began); got < csiDefaultDuration-time.Minute || got > csiDefaultDuration+time.Minute {
		t.Errorf("default validity %v, want %v", got, csiDefaultDuration)
	}
	if len(files["ca.crt"]) == 0 {
		t.Error("no ca.crt")
	}
	files, _ = c.csiFiles(p, map[string]string{csiAttr + "uri-sans": "spiffe://prism.local/admin/x", csiAttr + "key-algorithm": "ECDSA"})
	if block, _ := pem.Decode(files["tls.key"]); block == nil || block.Type != "EC PRIVATE KEY" {
		t.Fatalf("ECDSA without an encoding: %v, want EC PRIVATE KEY (SEC1)", block)
	}

	r := render(t, "testdata/defaults.yaml")
	for name, crt := range r.Certificates {
		k := crt.Spec.PrivateKey
		if k.Algorithm != "ECDSA" || k.Size != 256 || k.Encoding != "PKCS8" {
			t.Errorf("Certificate %s asks for %+v, want ECDSA 256 PKCS8", name, k)
		}
	}
	for name, d := range r.Deployments {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.CSI != nil {
				a := v.CSI.VolumeAttributes
				if a[csiAttr+"key-algorithm"] != "ECDSA" || a[csiAttr+"key-size"] != "256" || a[csiAttr+"key-encoding"] != "PKCS8" {
					t.Errorf("Deployment %s csi volume %s: %v", name, v.Name, a)
				}
			}
		}
	}
}
