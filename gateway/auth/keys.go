package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/prism-mesh/prism/mesh"
)

// maxJWKSBytes bounds a JWKS read from disk or the network.
const maxJWKSBytes = 1 << 20

// parseJWKS reads a JSON Web Key Set and keeps its signing keys. A
// symmetric or private key is refused, not skipped: it means the set is not
// the identity provider's public one, and an HMAC key would let anyone
// holding it mint tokens.
func parseJWKS(b []byte) ([]jose.JSONWebKey, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	var keys []jose.JSONWebKey
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue // an encryption key
		}
		switch k.Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
			keys = append(keys, k)
		default:
			return nil, fmt.Errorf("JWKS key %d (kid %q): %T refused; only RSA, EC and Ed25519 public keys verify tokens", i, k.KeyID, k.Key)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("JWKS holds no signing keys")
	}
	return keys, nil
}

// fileKeys is a JWKS file, re-read when its size or modification time
// changes. A stat per token is cheap next to the query it guards, and it
// makes a removed key refused on the next request, not after a poll.
type fileKeys struct {
	path string
	log  *slog.Logger

	mu   sync.Mutex
	mod  time.Time
	size int64
	keys []jose.JSONWebKey
}

func loadFileKeys(path string, log *slog.Logger) (*fileKeys, error) {
	f := &fileKeys{path: path, log: log}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("JWKS file: %w", err)
	}
	if f.keys, err = readJWKSFile(path); err != nil {
		return nil, err
	}
	f.mod, f.size = fi.ModTime(), fi.Size()
	return f, nil
}

func readJWKSFile(path string) ([]jose.JSONWebKey, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("JWKS file: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("JWKS file %s: %w", path, err)
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("JWKS file %s: larger than %d bytes", path, maxJWKSBytes)
	}
	keys, err := parseJWKS(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// get is the file's keys, re-read if it changed. A file that cannot be read
// or parsed (a rotation half done) leaves the keys read before in place.
func (f *fileKeys) get() []jose.JSONWebKey {
	fi, statErr := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if statErr != nil {
		if f.size >= 0 {
			f.log.Warn("JWKS file unreadable; keeping the keys read before", "path", f.path, "err", statErr)
			f.size = -1 // warn once, re-read once it is back
		}
		return f.keys
	}
	if fi.ModTime().Equal(f.mod) && fi.Size() == f.size {
		return f.keys
	}
	f.mod, f.size = fi.ModTime(), fi.Size()
	keys, err := readJWKSFile(f.path)
	if err != nil {
		f.log.Warn("JWKS file changed but is not a valid key set; keeping the keys read before", "path", f.path, "err", err)
		return f.keys
	}
	f.keys = keys
	f.log.Info("JWKS file reloaded", "path", f.path, "keys", len(keys))
	return f.keys
}

// urlKeys is a JWKS fetched over https and cached. Requests never wait for
// a routine refresh (the cached keys serve meanwhile); they wait only when
// there are no keys yet or the token names a key the cache lacks (a new
// key), and then at most FetchTimeout, and not more than once per
// MinRefresh.
type urlKeys struct {
	cfg Config

	fetchMu    sync.Mutex // one fetch at a time
	refreshing atomic.Bool

	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // of the keys held
	tried   time.Time // the last fetch, successful or not
}

// httpsOnly refuses a redirect of the JWKS URL to anything but https.
func httpsOnly(req *http.Request, via []*http.Request) error {
	if req.URL.Scheme != "https" {
		return fmt.Errorf("JWKS redirected to %s, not https", req.URL.Redacted())
	}
	if len(via) >= 5 {
		return errors.New("JWKS: too many redirects")
	}
	return nil
}

func (u *urlKeys) get(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	u.mu.Lock()
	keys, fetched := u.keys, u.fetched
	u.mu.Unlock()
	switch {
	case keys == nil || kid != "" && !hasKey(keys, kid):
		ctx, cancel := context.WithTimeout(ctx, u.cfg.FetchTimeout)
		defer cancel()
		if err := u.maybeRefresh(ctx); err != nil {
			u.cfg.Logger.Warn("JWKS fetch failed", "url", u.cfg.JWKSURL, "err", err)
		}
		u.mu.Lock()
		keys = u.keys
		u.mu.Unlock()
	case u.cfg.Clock.Since(fetched) >= u.cfg.CacheFor && u.refreshing.CompareAndSwap(false, true):
		go func() {
			defer u.refreshing.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), u.cfg.FetchTimeout)
			defer cancel()
			if err := u.maybeRefresh(ctx); err != nil {
				u.cfg.Logger.Warn("JWKS refresh failed; the cached keys still serve", "url", u.cfg.JWKSURL, "err", err)
			}
		}()
	}
	if keys == nil {
		return nil, &mesh.AuthError{Kind: mesh.KeysUnavailable, Msg: "no signing keys to check the token with: the JWKS could not be fetched"}
	}
	return keys, nil
}

func hasKey(keys []jose.JSONWebKey, kid string) bool {
	for _, k := range keys {
		if k.KeyID == kid {
			return true
		}
	}
	return false
}

// maybeRefresh fetches the JWKS unless a fetch was tried less than
// MinRefresh ago.
func (u *urlKeys) maybeRefresh(ctx context.Context) error {
	u.fetchMu.Lock()
	defer u.fetchMu.Unlock()
	u.mu.Lock()
	recent := !u.tried.IsZero() && u.cfg.Clock.Since(u.tried) < u.cfg.MinRefresh
	u.mu.Unlock()
	if recent {
		return nil
	}
	return u.refreshLocked(ctx)
}

// refresh fetches the JWKS now.
func (u *urlKeys) refresh(ctx context.Context) error {
	u.fetchMu.Lock()
	defer u.fetchMu.Unlock()
	return u.refreshLocked(ctx)
}

func (u *urlKeys) refreshLocked(ctx context.Context) error {
	now := u.cfg.Clock.Now()
	u.mu.Lock()
	u.tried = now
	u.mu.Unlock()
	keys, err := u.fetch(ctx)
	if err != nil {
		return err
	}
	u.mu.Lock()
	u.keys, u.fetched = keys, now
	u.mu.Unlock()
	return nil
}

func (u *urlKeys) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := u.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u.cfg.JWKSURL, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u.cfg.JWKSURL, err)
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", u.cfg.JWKSURL, maxJWKSBytes)
	}
	return parseJWKS(b)
}
