package lookup

import (
	"log/slog"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
)

// Config is what the lookup answers from.
type Config struct {
	// Routes is the FSM the answers are read from.
	Routes Routes
	// NamespacesClaim, when set, is the Envoy gateway's query auth: Check
	// then refuses a request naming a namespace that claim of the verified
	// token does not list (ir.QueryAuth.Claim). Empty checks no tokens.
	NamespacesClaim string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server serves both the RLS lookup and Envoy's ext_authz.
type Server struct {
	authv3.UnimplementedAuthorizationServer

	routes Routes
	claim  string
	log    *slog.Logger
}

// New builds a Server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{routes: cfg.Routes, claim: cfg.NamespacesClaim, log: cfg.Logger}
}

// Register adds both services to s.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	RegisterRouteLookupServer(r, s)
	authv3.RegisterAuthorizationServer(r, s)
}
