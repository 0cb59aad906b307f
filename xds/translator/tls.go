package translator

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/xds/ir"
)

// Names the clients' bootstraps define for upstream mutual TLS.
//
// The two data planes take certificates differently, so under
// ir.UpstreamTLS every cluster comes in two variants with the same name
// (Resources.Clusters and Resources.EnvoyClusters; xds/cache serves each
// client its own):
//   - grpc-go (gRFC A29) only reads certificate provider instances, named
//     in its bootstrap's certificate_providers (a file_watcher on the
//     gateway's files), and NACKs a cluster naming SDS secrets without them;
//   - Envoy does not implement certificate provider instances and reads
//     SDS secrets; named without a config source, they are the static
//     secrets of its bootstrap (envoy.Config.TLS), read from the gateway's
//     files. The control plane never holds a gateway's private key.
const (
	// CertProviderInstance is the grpc-go bootstrap's certificate provider
	// instance for both the gateway's certificate and the trust bundle.
	CertProviderInstance = mesh.CertProviderInstance
	// EnvoyIdentitySecret is the Envoy bootstrap's static secret with the
	// gateway's certificate and key.
	EnvoyIdentitySecret = "prism-identity"
	// EnvoyCASecret is the Envoy bootstrap's static secret with the trust
	// bundle.
	EnvoyCASecret = "prism-ca"
)

// sanPrefix is the URI SAN prefix of every identity of role in the trust
// domain.
func sanPrefix(u ir.UpstreamTLS, role identity.Role) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
		Prefix: "spiffe://" + u.TrustDomain + "/" + string(role) + "/",
	}}
}

// proxySAN accepts exactly the proxy's identity: only its runner holds
// the proxy's certificate.
func proxySAN(u ir.UpstreamTLS, proxyID string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{
		Exact: identity.Identity{TrustDomain: u.TrustDomain, Role: identity.Proxy, Name: proxyID}.String(),
	}}
}

// withTLS gives grpc-go's cluster g and Envoy's e each an
// UpstreamTlsContext that presents the gateway's certificate and accepts a
// peer of the trust bundle whose URI SAN matches san.
func withTLS(g, e *clusterv3.Cluster, san *matcherv3.StringMatcher) error {
	grpcTS, err := tlsSocket(&tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: CertProviderInstance},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: CertProviderInstance},
			// grpc-go reads the untyped list only; it matches every SAN
			// type, and a SPIFFE ID only ever appears as a URI.
			MatchSubjectAltNames: []*matcherv3.StringMatcher{san}, //nolint:staticcheck // deprecated for Envoy, the only field grpc-go v1.85 reads (xdsresource/unmarshal_cds.go)
		}},
	})
	if err != nil {
		return err
	}
	envoyTS, err := tlsSocket(&tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_3},
		// grpc-go servers (the runners, the admin nodes) refuse a TLS
		// client that does not offer h2.
		AlpnProtocols:                  []string{"h2"},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: EnvoyIdentitySecret}},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: san}},
			},
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: EnvoyCASecret},
		}},
	})
	if err != nil {
		return err
	}
	g.TransportSocket, e.TransportSocket = grpcTS, envoyTS
	return nil
}

func tlsSocket(common *tlsv3.CommonTlsContext) (*corev3.TransportSocket, error) {
	cfg, err := toAny(&tlsv3.UpstreamTlsContext{CommonTlsContext: common})
	if err != nil {
		return nil, err
	}
	return &corev3.TransportSocket{Name: wellknown.TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: cfg}}, nil
}
