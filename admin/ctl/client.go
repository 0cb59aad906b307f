package ctl

import (
	"errors"
	"math"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh/pki"
)

// newClient calls the admin cluster through any of the comma-separated
// endpoints, each try bounded by attempt, going round them until the
// command's --timeout: an operator would rather wait for an election than
// retry by hand. When none accepts a connection for unreachableAfter it
// gives up: nothing is listening there. A nil tls talks plaintext. The
// admin's List calls answer pages of at most 2 MiB, but an admin older than
// paging answers a list whole, and one item (a proxy with 100k namespaces)
// may pass gRPC's default 4 MiB receive limit, so prismctl takes what the
// admin may send (math.MaxInt32).
func newClient(admin string, attempt time.Duration, tls *pki.Source) (*client.Client, error) {
	eps := splitList(admin)
	if len(eps) == 0 {
		return nil, errors.New("no admin endpoints: set --admin host:port,... or " + envAdmin)
	}
	return client.New(client.Config{
		Endpoints:        eps,
		Attempt:          attempt,
		TLS:              tls,
		Backoff:          wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 100, Cap: 2 * time.Second},
		UnreachableAfter: unreachableAfter,
		DialOptions:      []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32))},
	})
}
