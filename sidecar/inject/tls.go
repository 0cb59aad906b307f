package inject

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/prism-mesh/prism/mesh/identity"
)

// TLSMode says where the sidecar and the pod's runner get the identity they
// share, spiffe://<trust-domain>/proxy/<proxy-id>.
type TLSMode string

const (
	// TLSCSI mounts a volume of cert-manager's csi-driver, which issues every
	// pod its own certificate for its proxy id and renews it in place (the
	// prism servers reload it on the next handshake).
	TLSCSI TLSMode = "csi"
	// TLSSecret mounts a Secret the user made, holding ca.crt and
	// <proxy-id>.crt / <proxy-id>.key for every proxy id it serves.
	TLSSecret TLSMode = "secret"
	// TLSInsecure runs the sidecar with --insecure: plaintext, no identity.
	TLSInsecure TLSMode = "insecure"
)

// TLSModes lists the modes, for flag help and errors.
var TLSModes = []TLSMode{TLSCSI, TLSSecret, TLSInsecure}

// Where the identity is mounted, and the variables the prism commands read
// their TLS flags from (cmd/prism's tlsFlags).
const (
	TLSVolumeName = "prism-tls"
	TLSMountPath  = "/etc/prism/tls"
	EnvTLSCA      = "PRISM_TLS_CA"
	EnvTLSCert    = "PRISM_TLS_CERT"
	EnvTLSKey     = "PRISM_TLS_KEY"
	// The file names csi-driver writes by default; a Secret's keys are
	// projected to the same names.
	FileCA   = "ca.crt"
	FileCert = "tls.crt"
	FileKey  = "tls.key"
)

// cert-manager csi-driver's driver name and the volume attributes the
// injector sets (github.com/cert-manager/csi-driver pkg/apis/v1alpha1).
const (
	CSIDriver         = "csi.cert-manager.io"
	CSIIssuerName     = "csi.cert-manager.io/issuer-name"
	CSIIssuerKind     = "csi.cert-manager.io/issuer-kind"
	CSIIssuerGroup    = "csi.cert-manager.io/issuer-group"
	CSIURISANs        = "csi.cert-manager.io/uri-sans"
	CSIKeyUsages      = "csi.cert-manager.io/key-usages"
	CSIDuration       = "csi.cert-manager.io/duration"
	CSIKeyAlgorithm   = "csi.cert-manager.io/key-algorithm"
	CSIKeySize        = "csi.cert-manager.io/key-size"
	CSIKeyEncoding    = "csi.cert-manager.io/key-encoding"
	CSIFSGroup        = "csi.cert-manager.io/fs-group"
	CSIPodNameVar     = "${POD_NAME}"
	csiKeyUsagesMTLS  = "digital signature,key encipherment,server auth,client auth"
	defaultIssuerKind = "Issuer"
	defaultIssuerGrp  = "cert-manager.io"
)

// TLSOptions are how a pod gets its proxy identity.
type TLSOptions struct {
	Mode TLSMode
	// TrustDomain is the mesh's, for the URI SAN csi-driver requests.
	TrustDomain string
	// Issuer signs the csi-driver requests: a CA-like cert-manager issuer
	// that fills in ca.crt (csi-driver cannot use a SelfSigned one).
	Issuer IssuerRef
	// Duration of a csi-driver certificate; 0 is the driver's default.
	Duration time.Duration
	// Key is the key csi-driver makes; its zero fields leave the driver's
	// defaults (RSA 2048 as PKCS#1), which Prism reads as well.
	Key KeyOptions
	// SecretName is the Secret of the secret mode.
	SecretName string
	// Containers are the pod's containers that serve as the same proxy (the
	// runner): they get the mount and the PRISM_TLS_* variables too.
	Containers []string
}

// KeyOptions are csi-driver's key-algorithm (RSA, ECDSA or Ed25519),
// key-size (bits) and key-encoding (PKCS1 or PKCS8).
type KeyOptions struct {
	Algorithm string
	Size      int
	Encoding  string
}

// IssuerRef names a cert-manager Issuer or ClusterIssuer.
type IssuerRef struct {
	Name, Kind, Group string
}

// parseTLS overlays the TLS annotations on o and reports bad ones through bad.
func parseTLS(annotations map[string]string, o *Options, bad func(string, error)) {
	if v, ok := annotations[AnnotationTLSSecret]; ok {
		if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
			bad(AnnotationTLSSecret, errors.New(strings.Join(msgs, "; ")))
		}
		o.TLS.SecretName = v
	}
	if v, ok := annotations[AnnotationTLSContainers]; ok {
		var names []string
		for _, raw := range strings.Split(v, ",") {
			if n := strings.TrimSpace(raw); n != "" {
				if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
					bad(AnnotationTLSContainers, fmt.Errorf("%q: %s", n, strings.Join(msgs, "; ")))
				}
				names = append(names, n)
			}
		}
		o.TLS.Containers = names
	}
}

// validate checks what the mode needs once annotations are applied; the
// error names the annotation or injector flag to fix.
func (t TLSOptions) validate(annotations map[string]string) error {
	switch t.Mode {
	case TLSInsecure:
		return nil
	case TLSCSI:
		if _, err := identity.New(t.TrustDomain, identity.Proxy, "p"); err != nil {
			return fmt.Errorf("injector --mesh-trust-domain: %w", err)
		}
		if t.Issuer.Name == "" {
			return errors.New("csi mode needs the cert-manager issuer: set the injector's --mesh-issuer-name")
		}
		if t.Duration < 0 {
			return errors.New("injector --mesh-cert-duration: negative")
		}
		if a := t.Key.Algorithm; a != "" && a != "RSA" && a != "ECDSA" && a != "Ed25519" {
			return fmt.Errorf("injector --mesh-key-algorithm %q: want RSA, ECDSA or Ed25519", a)
		}
		if e := t.Key.Encoding; e != "" && e != "PKCS1" && e != "PKCS8" {
			return fmt.Errorf("injector --mesh-key-encoding %q: want PKCS1 or PKCS8", e)
		}
		if t.Key.Size < 0 {
			return errors.New("injector --mesh-key-size: negative")
		}
		return nil
	case TLSSecret:
		if t.SecretName == "" {
			return &AnnotationError{Key: AnnotationTLSSecret, Value: annotations[AnnotationTLSSecret],
				Err: errors.New("secret mode needs the Secret: set the annotation or the injector's --mesh-tls-secret")}
		}
		return nil
	}
	return fmt.Errorf("mesh TLS mode %q: want one of %v (the injector's --mesh-tls)", t.Mode, TLSModes)
}

// tlsIdentityName is the name in the pod's proxy identity: the proxy id, or
// the pod's name, which csi-driver fills in itself for pods named only
// after admission. A Secret's keys must be known now.
func tlsIdentityName(pod *corev1.Pod, o Options) (string, error) {
	switch {
	case o.ProxyID != "":
		return o.ProxyID, nil
	case o.TLS.Mode == TLSCSI:
		return CSIPodNameVar, nil
	case pod.Name != "":
		return pod.Name, nil
	case o.TLS.Mode == TLSSecret:
		return "", &AnnotationError{Key: AnnotationProxyID, Err: errors.New("secret mode needs the proxy id before the pod has a name (a pod of a Deployment or ReplicaSet): set the annotation")}
	}
	return "", nil
}

// addTLS gives the sidecar, and the pod's containers named in
// o.TLS.Containers, the identity volume and the variables pointing at it.
func addTLS(pod *corev1.Pod, sidecar *corev1.Container, o Options) error {
	if o.TLS.Mode == TLSInsecure {
		sidecar.Args = append(sidecar.Args, "--insecure")
		return nil
	}
	name, err := tlsIdentityName(pod, o)
	if err != nil {
		return err
	}
	vol := corev1.Volume{Name: TLSVolumeName}
	fsGroup := podFSGroup(pod)
	switch o.TLS.Mode {
	case TLSCSI:
		vol.CSI = csiVolume(o.TLS, name, fsGroup)
	case TLSSecret:
		vol.Secret = &corev1.SecretVolumeSource{SecretName: o.TLS.SecretName, Items: []corev1.KeyToPath{
			{Key: FileCA, Path: FileCA}, {Key: name + ".crt", Path: FileCert}, {Key: name + ".key", Path: FileKey},
		}}
		if fsGroup != nil {
			// Readable by the pod's group alone, not by every user.
			mode := int32(0o440)
			vol.Secret.DefaultMode = &mode
		}
	default:
		return fmt.Errorf("mesh TLS mode %q", o.TLS.Mode)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, vol)
	mountTLS(sidecar)
	for i := range pod.Spec.Containers {
		if slices.Contains(o.TLS.Containers, pod.Spec.Containers[i].Name) {
			mountTLS(&pod.Spec.Containers[i])
		}
	}
	return nil
}

func csiVolume(t TLSOptions, name string, fsGroup *int64) *corev1.CSIVolumeSource {
	kind, group := t.Issuer.Kind, t.Issuer.Group
	if kind == "" {
		kind = defaultIssuerKind
	}
	if group == "" {
		group = defaultIssuerGrp
	}
	attrs := map[string]string{
		CSIIssuerName:  t.Issuer.Name,
		CSIIssuerKind:  kind,
		CSIIssuerGroup: group,
		CSIURISANs:     "spiffe://" + t.TrustDomain + "/" + string(identity.Proxy) + "/" + name,
		CSIKeyUsages:   csiKeyUsagesMTLS,
	}
	if t.Duration > 0 {
		attrs[CSIDuration] = t.Duration.String()
	}
	for k, v := range map[string]string{CSIKeyAlgorithm: t.Key.Algorithm, CSIKeyEncoding: t.Key.Encoding} {
		if v != "" {
			attrs[k] = v
		}
	}
	if t.Key.Size > 0 {
		attrs[CSIKeySize] = strconv.Itoa(t.Key.Size)
	}
	if fsGroup != nil {
		// The files are written as root; the group lets a non-root
		// container read the key.
		attrs[CSIFSGroup] = strconv.FormatInt(*fsGroup, 10)
	}
	readOnly := true // csi-driver refuses writable volumes
	return &corev1.CSIVolumeSource{Driver: CSIDriver, ReadOnly: &readOnly, VolumeAttributes: attrs}
}

// podFSGroup is the group the pod's files should belong to: its fsGroup,
// else the group it runs as.
func podFSGroup(pod *corev1.Pod) *int64 {
	sc := pod.Spec.SecurityContext
	switch {
	case sc == nil:
		return nil
	case sc.FSGroup != nil:
		return sc.FSGroup
	default:
		return sc.RunAsGroup
	}
}

func mountTLS(c *corev1.Container) {
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: TLSVolumeName, MountPath: TLSMountPath, ReadOnly: true})
	c.Env = append(c.Env,
		corev1.EnvVar{Name: EnvTLSCA, Value: TLSMountPath + "/" + FileCA},
		corev1.EnvVar{Name: EnvTLSCert, Value: TLSMountPath + "/" + FileCert},
		corev1.EnvVar{Name: EnvTLSKey, Value: TLSMountPath + "/" + FileKey},
	)
}
