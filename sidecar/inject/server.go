package inject

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prism-mesh/prism/internal/connlimit"
)

// Paths the API server calls, one per webhook entry in the chart's
// MutatingWebhookConfiguration.
const (
	PathInjectPod       = "/inject"
	PathInjectNamespace = "/inject/namespace"
)

// CertReloader serves the key pair in two files and picks up a new pair
// when the files change (cert-manager or the chart rotating the Secret),
// without a restart and without dropping connections.
type CertReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	certMod fileStamp
	keyMod  fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewCertReloader loads the pair once; a missing or bad pair at start is an
// error, while a bad pair later keeps the last good one in service.
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

func (r *CertReloader) reload() error {
	cs, err := stamp(r.certFile)
	if err != nil {
		return fmt.Errorf("tls cert %s: %w", r.certFile, err)
	}
	ks, err := stamp(r.keyFile)
	if err != nil {
		return fmt.Errorf("tls key %s: %w", r.keyFile, err)
	}
	if r.cert != nil && cs == r.certMod && ks == r.keyMod {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load tls pair %s %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.certMod, r.keyMod = &pair, cs, ks
	return nil
}

// GetCertificate is a tls.Config hook: a stat of both files per handshake
// is cheap next to the handshake itself.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.reload(); err != nil {
		// Mid-rotation the cert may be new and the key still old; keep
		// serving the last good pair until both files agree.
		r.log.Warn("tls reload failed, serving previous certificate", "err", err)
	}
	return r.cert, nil
}

// NewHandler routes the webhook paths and the usual operational endpoints.
// Readiness means a certificate is loaded, which NewCertReloader ensures,
// so /readyz answers like /healthz.
func NewHandler(w *Webhook, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PathInjectPod, w.Handler(SelectedByPod))
	mux.Handle(PathInjectNamespace, w.Handler(SelectedByNamespace))
	ok := func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

// Serve answers HTTPS on ln until ctx ends, then drains in-flight reviews.
// Its connections are held to bounds (internal/connlimit: the handshake,
// the idle time and, on HTTP/2, the ping rate).
func Serve(ctx context.Context, ln net.Listener, h http.Handler, certs *CertReloader, bounds connlimit.Bounds, log *slog.Logger) error {
	srv := bounds.HTTP(&http.Server{
		Handler: h,
		// The API server gives a webhook 10 s at most; a slower client is
		// not the API server.
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: certs.GetCertificate,
		},
	})
	if err := bounds.HTTP2(srv); err != nil {
		return fmt.Errorf("serve injector: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve injector: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown injector: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve injector: %w", err)
	}
	return nil
}
