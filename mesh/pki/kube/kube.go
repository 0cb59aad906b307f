// Package kube keeps a mesh's certificates in Kubernetes Secrets: a CA made
// once into a Secret of its own, and the Secrets of the chart's secret mode
// (ca.crt plus a certificate and key per identity) issued from it. The
// chart's tls.mode generate runs it in a hook Job (`prism certs
// kube-secrets`), since Helm's genSignedCert cannot write the SPIFFE URI SAN
// every identity needs. It lives apart from mesh/pki so that the servers
// loading certificates do not link client-go, and it reaches the API server
// with a REST client that knows core/v1 only (NewSecrets): the typed
// clientset registers every API group and was 12 MB of prism's binary for
// three calls on Secrets.
package kube

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// Keys of the Secrets: the trust bundle beside every identity, the CA's own
// key in the CA Secret only, and the certificate and key of an identity
// under <file>.crt and <file>.key.
const (
	KeyCA     = "ca.crt"
	KeyCAKey  = "ca.key"
	CertExt   = ".crt"
	KeyExt    = ".key"
	FileTLS   = "tls"
	LabelKey  = "app.kubernetes.io/managed-by"
	LabelSelf = "prism-certs"
)

// Identity is one certificate of a Secret.
type Identity struct {
	Role identity.Role
	Name string
	// File is the Secret key's stem: the name (prism-admin-0.crt) where
	// one Secret holds many identities, FileTLS where it holds one.
	File string
}

// Secret is one Secret to keep and the identities it holds.
type Secret struct {
	Name       string
	Identities []Identity
}

// Plan is every Secret of one install.
type Plan struct {
	Namespace   string
	TrustDomain string
	// CASecret holds the CA. It is made on the first run and read on every
	// later one, so the CA, and the trust of every running pod, survives
	// upgrades.
	CASecret   string
	CAValidity time.Duration
	// Validity of each certificate; one left with less than a third of its
	// own is issued again.
	Validity time.Duration
	Secrets  []Secret
	// Labels go on every Secret made, beside LabelKey=LabelSelf.
	Labels map[string]string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Result says what a run changed.
type Result struct {
	CACreated bool
	// Issued are the certificates written, as <secret>/<file>.
	Issued []string
	// Kept counts the certificates left as they were.
	Kept int
}

// Sync makes the CA Secret unless it exists, then creates or updates each
// Secret of p so that it holds the CA's bundle and, for each identity, a
// certificate from that CA with that identity and more than a third of its
// validity left. A run that finds everything so changes nothing. secrets
// are p.Namespace's.
func Sync(ctx context.Context, secrets SecretClient, p Plan) (Result, error) {
	if p.Now == nil {
		p.Now = time.Now
	}
	var res Result
	if p.Validity <= 0 || p.CAValidity <= 0 {
		return res, fmt.Errorf("certificate validity %s and CA validity %s must be positive", p.Validity, p.CAValidity)
	}
	ca, created, err := p.loadOrCreateCA(ctx, secrets)
	if err != nil {
		return res, err
	}
	res.CACreated = created
	for _, s := range p.Secrets {
		issued, kept, err := p.syncSecret(ctx, secrets, ca, s)
		if err != nil {
			return res, err
		}
		res.Issued = append(res.Issued, issued...)
		res.Kept += kept
	}
	return res, nil
}

// SecretClient is the calls Sync makes on one namespace's Secrets: those of
// NewSecrets, or client-go's typed SecretInterface.
type SecretClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
	Create(ctx context.Context, s *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error)
	Update(ctx context.Context, s *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error)
}

// NewSecrets is namespace's Secrets on the API server cfg reaches, over a
// REST client that decodes core/v1 and the API's Status errors (so
// apierrors.IsNotFound and friends work as with the clientset).
func NewSecrets(cfg *rest.Config, namespace string) (SecretClient, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return restSecrets{c: rc, params: runtime.NewParameterCodec(scheme), namespace: namespace}, nil
}

type restSecrets struct {
	c         *rest.RESTClient
	params    runtime.ParameterCodec
	namespace string
}

func (r restSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	out := &corev1.Secret{}
	err := r.c.Get().Namespace(r.namespace).Resource("secrets").Name(name).VersionedParams(&opts, r.params).Do(ctx).Into(out)
	return out, err
}

func (r restSecrets) Create(ctx context.Context, s *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	out := &corev1.Secret{}
	err := r.c.Post().Namespace(r.namespace).Resource("secrets").VersionedParams(&opts, r.params).Body(s).Do(ctx).Into(out)
	return out, err
}

func (r restSecrets) Update(ctx context.Context, s *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	out := &corev1.Secret{}
	err := r.c.Put().Namespace(r.namespace).Resource("secrets").Name(s.Name).VersionedParams(&opts, r.params).Body(s).Do(ctx).Into(out)
	return out, err
}

func (p Plan) loadOrCreateCA(ctx context.Context, secrets SecretClient) (*pki.CA, bool, error) {
	s, err := secrets.Get(ctx, p.CASecret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		ca, err := pki.NewCA(p.TrustDomain, p.CAValidity)
		if err != nil {
			return nil, false, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
		if err != nil {
			return nil, false, fmt.Errorf("CA Secret %s: %w", p.CASecret, err)
		}
		obj := p.newSecret(p.CASecret, corev1.SecretTypeOpaque)
		obj.Data = map[string][]byte{KeyCA: ca.CertPEM(), KeyCAKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}
		if _, err := secrets.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return nil, false, fmt.Errorf("create CA Secret %s/%s: %w", p.Namespace, p.CASecret, err)
		}
		return ca, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("read CA Secret %s/%s: %w", p.Namespace, p.CASecret, err)
	}
	if err := p.ours(s); err != nil {
		return nil, false, err
	}
	ca, err := parseCA(p.TrustDomain, s.Data[KeyCA], s.Data[KeyCAKey])
	if err != nil {
		return nil, false, fmt.Errorf("CA Secret %s/%s: %w", p.Namespace, p.CASecret, err)
	}
	if now := p.Now(); !now.Before(ca.Cert.NotAfter) {
		return nil, false, fmt.Errorf("CA Secret %s/%s: the CA expired at %s; delete the Secret to make a new CA (pods restart to trust it)",
			p.Namespace, p.CASecret, ca.Cert.NotAfter.Format(time.RFC3339))
	}
	return ca, false, nil
}

// parseCA reads the CA Secret's certificate and key, checking they belong
// together.
func parseCA(trustDomain string, certPEM, keyPEM []byte) (*pki.CA, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyCA, err)
	}
	key, err := pki.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyCAKey, err)
	}
	if !cert.IsCA || !samePublicKey(cert, key) {
		return nil, fmt.Errorf("%s and %s are not a CA certificate and its key", KeyCA, KeyCAKey)
	}
	return &pki.CA{TrustDomain: trustDomain, Cert: cert, Key: key}, nil
}

// syncSecret brings one Secret in line with the CA, returning the
// certificates it wrote and the count it kept.
func (p Plan) syncSecret(ctx context.Context, secrets SecretClient, ca *pki.CA, want Secret) (issued []string, kept int, err error) {
	typ := corev1.SecretTypeOpaque
	if len(want.Identities) == 1 && want.Identities[0].File == FileTLS {
		// tls.crt and tls.key: the type kubectl and Ingress controllers know.
		typ = corev1.SecretTypeTLS
	}
	s, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err):
		s = p.newSecret(want.Name, typ)
	case err != nil:
		return nil, 0, fmt.Errorf("read Secret %s/%s: %w", p.Namespace, want.Name, err)
	default:
		if err := p.ours(s); err != nil {
			return nil, 0, err
		}
	}
	data := make(map[string][]byte, 1+2*len(want.Identities))
	for k, v := range s.Data {
		data[k] = v
	}
	changed := !bytes.Equal(data[KeyCA], ca.CertPEM())
	data[KeyCA] = ca.CertPEM()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	now := p.Now()
	for _, w := range want.Identities {
		id, err := identity.New(p.TrustDomain, w.Role, w.Name)
		if err != nil {
			return nil, 0, fmt.Errorf("Secret %s: %w", want.Name, err)
		}
		certKey, keyKey := w.File+CertExt, w.File+KeyExt
		if current(data[certKey], data[keyKey], id, roots, now) {
			kept++
			continue
		}
		req := pki.Request{Role: w.Role, Name: w.Name, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(p.Validity)}
		if req.NotAfter.After(ca.Cert.NotAfter) {
			req.NotAfter = ca.Cert.NotAfter
		}
		certPEM, keyPEM, err := ca.Issue(req)
		if err != nil {
			return nil, 0, fmt.Errorf("Secret %s: %w", want.Name, err)
		}
		data[certKey], data[keyKey] = certPEM, keyPEM
		issued = append(issued, want.Name+"/"+w.File)
		changed = true
	}
	if !changed {
		return nil, kept, nil
	}
	s.Data = data
	if exists {
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, 0, fmt.Errorf("write Secret %s/%s: %w", p.Namespace, want.Name, err)
	}
	return issued, kept, nil
}

// current reports a certificate and key that may stay: a pair, from the
// CA, naming id, valid now with more than a third of its validity left
// (cert-manager renews at two thirds too).
func current(certPEM, keyPEM []byte, id identity.Identity, roots *x509.CertPool, now time.Time) bool {
	cert, err := parseCert(certPEM)
	if err != nil {
		return false
	}
	key, err := pki.ParsePrivateKey(keyPEM)
	if err != nil || !samePublicKey(cert, key) {
		return false
	}
	if got, err := identity.FromCert(cert); err != nil || got != id {
		return false
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return false
	}
	return cert.NotAfter.Sub(now) > cert.NotAfter.Sub(cert.NotBefore)/3
}

func (p Plan) newSecret(name string, typ corev1.SecretType) *corev1.Secret {
	labels := map[string]string{}
	for k, v := range p.Labels {
		labels[k] = v
	}
	labels[LabelKey] = LabelSelf
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.Namespace, Labels: labels},
		Type:       typ,
	}
}

// ours refuses a Secret something else made: overwriting a user's Secret,
// or cert-manager's CA, would break whatever relies on it.
func (p Plan) ours(s *corev1.Secret) error {
	if s.Labels[LabelKey] != LabelSelf {
		return fmt.Errorf("Secret %s/%s exists and was not made by prism certs (no label %s=%s): delete or rename it",
			p.Namespace, s.Name, LabelKey, LabelSelf)
	}
	return nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func samePublicKey(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}
