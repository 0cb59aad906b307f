package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	xdsbootstrap "google.golang.org/grpc/xds/bootstrap"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// AdminScheme is the resolver scheme of a bootstrap's one xDS server:
// "prism-admins:///host:port,host:port,..." resolves to every admin node.
//
// One server that resolves to all nodes, rather than one bootstrap server per
// node, is what makes the gateway follow the mesh when its admin node dies:
// grpc-go falls back to a later bootstrap server only while it lacks a
// resource, so with routes cached it would keep retrying the dead node and
// miss every later change. One channel over all addresses instead reconnects
// (pick_first, in the listed order) to the next live node, which serves the
// same versions from its own copy of the Raft log.
const AdminScheme = "prism-admins"

// DefaultNodeCluster is the xDS node cluster the gateway reports.
const DefaultNodeCluster = "prism-gateway"

// Bootstrap returns a grpc-go xDS bootstrap whose ADS server is the admin
// nodes at admins (host:port each), tried in order. With tls (the gateway's
// own files) the gateway speaks mutual TLS: to the admin nodes, which must
// present an admin identity (channel credentials MTLSCredsType), and to the
// runners, through grpc-go's xDS credentials and the certificate provider
// instance mesh.CertProviderInstance that the control plane's clusters
// name. Nil tls is plaintext.
func Bootstrap(admins []string, nodeID string, tls *pki.Files) ([]byte, error) {
	if len(admins) == 0 {
		return nil, errors.New("bootstrap: no admin node")
	}
	for _, a := range admins {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("bootstrap: admin %q: %w", a, err)
		}
	}
	if nodeID == "" {
		return nil, errors.New("bootstrap: node id is required")
	}
	creds := map[string]any{"type": "insecure"}
	b := map[string]any{"node": map[string]any{"id": nodeID, "cluster": DefaultNodeCluster}}
	if tls != nil {
		if tls.CA == "" || tls.Cert == "" || tls.Key == "" {
			return nil, fmt.Errorf("bootstrap: the CA bundle, certificate and key files are all required (have %+v)", *tls)
		}
		files := map[string]any{"ca_certificate_file": tls.CA, "certificate_file": tls.Cert, "private_key_file": tls.Key}
		creds = map[string]any{"type": MTLSCredsType, "config": files}
		watcher := maps.Clone(files)
		watcher["refresh_interval"] = certRefresh.String()
		b["certificate_providers"] = map[string]any{
			mesh.CertProviderInstance: map[string]any{"plugin_name": "file_watcher", "config": watcher},
		}
	}
	b["xds_servers"] = []any{map[string]any{
		"server_uri":      AdminScheme + ":///" + strings.Join(admins, ","),
		"channel_creds":   []any{creds},
		"server_features": []string{"xds_v3"},
	}}
	return json.Marshal(b)
}

// certRefresh is how often grpc-go's file_watcher re-reads the gateway's
// files for the connections to runners, so a rotated certificate is used
// within it.
const certRefresh = 10 * time.Second

// MTLSCredsType is the bootstrap channel credentials type of mutual TLS to
// the admin nodes: config {ca_certificate_file, certificate_file,
// private_key_file}, the gateway's own files.
//
// grpc-go's own "tls" type checks the admin node's certificate against the
// host name of the server URI, which names every admin node at once and
// which Prism's certificates (named by SPIFFE identity) do not carry; this
// one checks the identity instead (mesh/pki), re-reading the files on every
// handshake.
const MTLSCredsType = "prism-mtls"

type mtlsCreds struct{}

func (mtlsCreds) Name() string { return MTLSCredsType }

func (mtlsCreds) Build(config json.RawMessage) (credentials.Bundle, func(), error) {
	var c struct {
		CA   string `json:"ca_certificate_file"`
		Cert string `json:"certificate_file"`
		Key  string `json:"private_key_file"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, nil, fmt.Errorf("%s channel credentials: %w", MTLSCredsType, err)
	}
	src, err := pki.Load(pki.Files{CA: c.CA, Cert: c.Cert, Key: c.Key}, slog.Default())
	if err != nil {
		return nil, nil, fmt.Errorf("%s channel credentials: %w", MTLSCredsType, err)
	}
	return mtlsBundle{credentials.NewTLS(src.ClientConfig(pki.RoleIs(identity.Admin)))}, func() {}, nil
}

type mtlsBundle struct {
	tc credentials.TransportCredentials
}

func (b mtlsBundle) TransportCredentials() credentials.TransportCredentials { return b.tc }
func (mtlsBundle) PerRPCCredentials() credentials.PerRPCCredentials         { return nil }
func (mtlsBundle) NewWithMode(string) (credentials.Bundle, error) {
	return nil, errors.New(MTLSCredsType + " credentials have one mode")
}

// grpc-go resolves a bootstrap's server_uri and its channel credentials
// through global registries, which are only safe to fill at init time.
func init() {
	resolver.Register(adminsBuilder{})
	xdsbootstrap.RegisterChannelCredentials(mtlsCreds{})
}

// adminsBuilder resolves AdminScheme targets to their static address list.
type adminsBuilder struct{}

func (adminsBuilder) Scheme() string { return AdminScheme }

func (adminsBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(t.Endpoint(), ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s target %q: no address", AdminScheme, t.URL.String())
	}
	if err := cc.UpdateState(resolver.State{Addresses: addrs}); err != nil {
		return nil, fmt.Errorf("%s target %q: %w", AdminScheme, t.URL.String(), err)
	}
	return staticResolver{}, nil
}

type staticResolver struct{}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (staticResolver) Close()                                {}
