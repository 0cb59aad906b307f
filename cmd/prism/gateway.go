package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/gateway/auth"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/pki"
)

type gatewayFlags struct {
	admin     string
	nodeID    string
	httpAddr  string
	grpcAddr  string
	timeout   time.Duration
	logLevel  string
	logFormat string
	tls       tlsFlags
	conn      connFlags
	// Query authentication: JWT bearer tokens verified against a JWKS,
	// whose claim lists the namespaces a token may read; noQueryAuth
	// serves every namespace to anyone who reaches the listeners.
	jwksFile, jwksURL, jwtIssuer, jwtAudience, jwtNamespacesClaim string
	noQueryAuth                                                   bool
	// identity is what tls loaded: the gateway's mTLS identity toward the
	// admin nodes and the runners; nil is plaintext (--insecure).
	identity *pki.Source
}

func gatewayCommand() *cobra.Command {
	var f gatewayFlags
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "HTTP/JSON and gRPC front door to the mailboxes, routed by xDS (for machines without Envoy)",
		Long: `gateway answers the query API (GET /v1/mailboxes/{id}/events, /events/{message_id}, /stats and the same
under /v1/namespaces/{namespace}/) on --http-addr and prism.mailbox.v1.MailboxQuery on --grpc-addr, turning each
request into one MailboxQuery call on grpc-go's xDS channel xds:///mailbox-query. The routes come from the admin
nodes in --admin (tried in order; the gateway moves to the next when its node goes away), so queries land on the
runner holding the mailbox's lease; the gateway does no routing of its own.

With --tls-ca/--tls-cert/--tls-key (a gateway/<name> identity) the gateway speaks mutual TLS to the admin nodes
(which must present admin identities) and to the runners (each must present the proxy identity of its cluster);
--insecure runs in plaintext. Without --admin, grpc-go's bootstrap is read from $GRPC_XDS_BOOTSTRAP or
$GRPC_XDS_BOOTSTRAP_CONFIG, which must then name the certificate provider "prism" itself.
/readyz turns 200 once the routes have arrived. SIGTERM or SIGINT stops serving.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return runGateway(ctx, cmd, f)
		},
	}
	host, _ := os.Hostname()
	fs := cmd.Flags()
	fs.StringVar(&f.admin, "admin", "", "admin nodes' gRPC addresses (xDS), comma-separated host:port, tried in order")
	fs.StringVar(&f.nodeID, "node-id", "prism-gateway-"+host, "xDS node id this gateway reports to the admin nodes; with TLS its identity's name by default (a gateway/<name> certificate may subscribe only as <name> or <name>/<replica>)")
	fs.StringVar(&f.httpAddr, "http-addr", ":8088", "HTTP listen address (query API, /metrics, /healthz, /readyz)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":9088", "gRPC listen address (MailboxQuery, health); empty disables")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on each upstream call")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	f.tls.register(fs)
	f.conn.register(fs, "--http-addr and --grpc-addr")
	fs.StringVar(&f.jwksFile, "jwks-file", "", "JWKS file verifying query bearer tokens (re-read when it changes)")
	fs.StringVar(&f.jwksURL, "jwks-url", "", "https URL of the JWKS verifying query bearer tokens (cached)")
	fs.StringVar(&f.jwtIssuer, "jwt-issuer", "", "iss query tokens must carry (required with --jwks-*)")
	fs.StringVar(&f.jwtAudience, "jwt-audience", "", "aud query tokens must include (required with --jwks-*)")
	fs.StringVar(&f.jwtNamespacesClaim, "jwt-namespaces-claim", mesh.DefaultNamespacesClaim, `claim listing the namespaces a token may read ("*" = all)`)
	fs.BoolVar(&f.noQueryAuth, "no-query-auth", false, "answer queries without a token: anyone who reaches the gateway reads every mailbox (a gateway on loopback, or behind another authenticating proxy)")
	return cmd
}

// queryAuth is the gateway's query authentication the flags ask for: a
// gateway answers only token holders unless --no-query-auth says otherwise.
func (f gatewayFlags) queryAuth(log *slog.Logger) ([]gateway.Option, error) {
	jwks := f.jwksFile != "" || f.jwksURL != ""
	switch {
	case jwks && f.noQueryAuth:
		return nil, errors.New("--no-query-auth and --jwks-file/--jwks-url exclude each other")
	case f.noQueryAuth:
		log.Warn("query authentication is off (--no-query-auth): anyone who reaches the gateway reads every mailbox")
		return nil, nil
	case !jwks:
		return nil, errors.New("query authentication is required: pass --jwks-file or --jwks-url with --jwt-issuer and --jwt-audience, or --no-query-auth")
	}
	a, err := auth.New(auth.Config{JWKSFile: f.jwksFile, JWKSURL: f.jwksURL, Issuer: f.jwtIssuer, Audience: f.jwtAudience,
		NamespacesClaim: f.jwtNamespacesClaim, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("query auth: %w", err)
	}
	return []gateway.Option{gateway.WithAuth(a)}, nil
}

func runGateway(ctx context.Context, cmd *cobra.Command, f gatewayFlags) error {
	log, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	if f.identity, err = f.tls.load(log); err != nil {
		return err
	}
	if f.identity != nil && !cmd.Flags().Changed("node-id") {
		// The admin nodes serve a gateway/<name> identity only as node <name>.
		f.nodeID = f.identity.Identity().Name
	}
	gw, err := startGateway(log, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "prism gateway: %s\n", gw.url)
	<-ctx.Done()
	log.Info("signal received; stopping the gateway")
	return gw.stop()
}

// runningGateway is a gateway serving in this process; prism dev runs one
// next to its admin node the same way.
type runningGateway struct {
	url      string // the HTTP API, http://host:port
	grpcAddr string // the gRPC listener's address, "" without one
	stop     func() error
}

// startGateway serves a gateway on f's addresses until stop; it is ready
// (/readyz) once its routes arrive.
func startGateway(log *slog.Logger, f gatewayFlags) (*runningGateway, error) {
	opts, err := f.queryAuth(log)
	if err != nil {
		return nil, err
	}
	conn, err := f.conn.bounds()
	if err != nil {
		return nil, err
	}
	cfg := gateway.Config{Timeout: f.timeout, Logger: log, TLS: f.identity}
	var files *pki.Files
	if f.identity != nil {
		fl := f.identity.Files()
		files = &fl
	}
	if admins := splitBrokers(f.admin); len(admins) > 0 {
		if cfg.Bootstrap, err = gateway.Bootstrap(admins, f.nodeID, files); err != nil {
			return nil, fmt.Errorf("--admin: %w", err)
		}
	} else if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		return nil, errors.New("--admin: required unless $GRPC_XDS_BOOTSTRAP or $GRPC_XDS_BOOTSTRAP_CONFIG is set")
	}
	hl, err := net.Listen("tcp", f.httpAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	var gl net.Listener
	if f.grpcAddr != "" {
		if gl, err = net.Listen("tcp", f.grpcAddr); err != nil {
			hl.Close()
			return nil, fmt.Errorf("--grpc-addr: %w", err)
		}
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		hl.Close()
		if gl != nil {
			gl.Close()
		}
		return nil, err
	}
	hs := conn.HTTP(&http.Server{Handler: gw.HTTPHandler(opts...)})
	go func() {
		if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	gs := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(gw.GRPCInterceptor(opts...)), grpc.MaxConcurrentStreams(1000)},
		conn.GRPC()...)...)
	gw.RegisterGRPC(gs)
	if gl != nil {
		go func() {
			if err := gs.Serve(gl); err != nil {
				log.Error("grpc server stopped", "err", err)
			}
		}()
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	go func() { _ = gw.Run(runCtx) }()

	attrs := []any{"http_addr", hl.Addr().String(), "admin", f.admin, "node_id", f.nodeID}
	if gl != nil {
		attrs = append(attrs, "grpc_addr", gl.Addr().String())
	}
	log.Info("gateway serving", attrs...)
	stop := func() error {
		cancelRun()
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout+time.Second)
		defer cancel()
		err := hs.Shutdown(ctx)
		gs.GracefulStop()
		return errors.Join(err, gw.Close())
	}
	rg := &runningGateway{url: "http://" + hl.Addr().String(), stop: stop}
	if gl != nil {
		rg.grpcAddr = gl.Addr().String()
	}
	return rg, nil
}
