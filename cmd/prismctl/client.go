package main

import (
	"errors"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh/pki"
)

// newClient calls the admin cluster through any of the comma-separated
// endpoints, each try bounded by attempt, going round them until the
// command's --timeout: an operator would rather wait for an election than
// retry by hand. A nil tls talks plaintext.
func newClient(admin string, attempt time.Duration, tls *pki.Source) (*client.Client, error) {
	var eps []string
	for _, e := range strings.Split(admin, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no admin endpoints: set --admin host:port,... or PRISM_ADMIN")
	}
	return client.New(client.Config{
		Endpoints: eps,
		Attempt:   attempt,
		TLS:       tls,
		Backoff:   wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 100, Cap: 2 * time.Second},
	})
}
