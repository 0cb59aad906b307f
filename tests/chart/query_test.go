package chart

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/authtest"
	"github.com/prism-mesh/prism/testkit/podproc"
)

// awaitLease creates namespace ns and waits until the sidecar of the runner pod it is placed on holds its
// mailbox, {ns}@{pod}, routed to that pod's query port; it returns that pod.
func (c *cluster) awaitLease(ns string, queryPort int) *pod {
	c.t.Helper()
	cc := c.operator(c.podNamed(adminName + "-0"))
	defer cc.Close()
	admin := adminv1.NewAdminClient(cc)
	// Created on the leader, as prismctl does when a follower cannot forward in time.
	c.await("namespace "+ns+" created", 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := admin.GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
		if err != nil || st.GetLeaderId() == "" {
			return fmt.Errorf("no leader: %v", err)
		}
		lc := c.operator(c.podNamed(st.GetLeaderId()))
		defer lc.Close()
		_, err = adminv1.NewControlPlaneClient(lc).CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{ns + ".events"}},
		})
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		return err
	})
	var holder *pod
	c.await("a sidecar leases "+ns+"'s mailbox", 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := admin.ListLeases(ctx, &adminv1.ListLeasesRequest{Namespace: ns})
		if err != nil {
			return err
		}
		for _, l := range resp.GetLeases() {
			for _, p := range c.podsOf(releaseName + "-runner") {
				if l.GetMailboxId() == ns+"@"+p.name && l.GetRunnerAddress() == net.JoinHostPort(p.net.IP.String(), strconv.Itoa(queryPort)) {
					holder = p
					return nil
				}
			}
		}
		return fmt.Errorf("leases %v, want %s@<runner pod> at that pod's port %d", resp.GetLeases(), ns, queryPort)
	})
	return holder
}

// checkQuery answers a query with a token through the gateway pod, the way a client reaches a mailbox.
// Envoy cannot run here, so grpc-go's data plane stands in for it in the gateway pod (prism gateway, the
// same routes and clusters over xDS, docs/architecture.md): as the Envoy container's node id (--service-node),
// with the identity the pod mounts in this TLS mode, to the admin address the Envoy bootstrap names, and
// checking tokens against a JWKS as Envoy's listener does. The query crosses the mesh's mutual TLS twice
// (gateway to admin for xDS, gateway to runner), on the certificates this mode gives the pods.
func (c *cluster) checkQuery(queryPort int) {
	c.t.Helper()
	began := time.Now()
	const ns = "chart-query"
	c.awaitLease(ns, queryPort)
	gw := c.podsOf(gatewayName)[0]
	envoy := gw.spec.Containers[slices.IndexFunc(gw.spec.Containers, func(ctr corev1.Container) bool { return ctr.Name == "envoy" })]
	_, vars := gw.env(c.t, envoy)
	var nodeID string
	for _, a := range gw.argv(envoy, vars) {
		if v, ok := strings.CutPrefix(a, "--service-node="); ok {
			nodeID = v
		}
	}
	key := authtest.NewKey(c.t, "k1", "ES256")
	jwks := filepath.Join(c.dir, "jwks")
	must(c.t, os.MkdirAll(jwks, 0o755))
	authtest.WriteJWKS(c.t, filepath.Join(jwks, "jwks.json"), key)
	must(c.t, os.Chmod(filepath.Join(jwks, "jwks.json"), 0o644)) // the gateway pod's user reads it
	spec := c.containerSpec(gw, envoy)
	spec.Argv = []string{binDir + "/prism", "gateway", "--admin=" + c.xdsAddress(gw, envoy), "--node-id=" + nodeID,
		"--http-addr=:8088", "--grpc-addr=", "--jwks-file=/etc/prism/jwks/jwks.json",
		"--jwt-issuer=https://issuer.test", "--jwt-audience=prism", "--log-format=text"}
	if _, ok := c.mountDir(gw, envoy, "/etc/prism/tls"); ok {
		spec.Argv = append(spec.Argv, "--tls-ca=/etc/prism/tls/ca.crt", "--tls-cert=/etc/prism/tls/tls.crt", "--tls-key=/etc/prism/tls/tls.key")
	} else {
		spec.Argv = append(spec.Argv, "--insecure")
	}
	spec.Mounts = append(spec.Mounts, podproc.Mount{Source: c.bin, Target: binDir, ReadOnly: true},
		podproc.Mount{Source: jwks, Target: "/etc/prism/jwks", ReadOnly: true})
	cmd, err := gw.net.Command(spec)
	must(c.t, err)
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	must(c.t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	url := fmt.Sprintf("http://%s/v1/namespaces/%s/events?limit=10", net.JoinHostPort(gw.net.IP.String(), "8088"), ns)
	get := func(token string) (int, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	token := key.Sign(c.t, authtest.Claims("https://issuer.test", "prism", ns))
	c.await("a query with a token through the gateway pod", 30*time.Second, func() error {
		code, err := get(token)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET %s: %d", url, code)
		}
		if err != nil {
			return fmt.Errorf("%w; prism gateway's log ends:\n%s", err, lastLines(out.String(), 5))
		}
		return nil
	})
	if code, err := get(""); err != nil || code != http.StatusUnauthorized {
		c.t.Errorf("a query without a token: %d, %v; want 401", code, err)
	}
	c.t.Logf("a query with a token answered through the gateway pod %v after the namespace was created", time.Since(began).Round(time.Millisecond))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
