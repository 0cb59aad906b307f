package chart

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/sidecar/inject"
	"github.com/prism-mesh/prism/testkit/podproc"
)

// TestLastRunnerStopsCleanly stops the last runner pod of a release in the chart's own stop order
// (docs/architecture.md#kubernetes-stop-order), as the kubelet does on a pod deletion: the runner container's
// rendered preStop hook (`prism sidecar drain-wait`) runs in the pod to its end, then the runner gets SIGTERM,
// then, once it has exited, its native sidecar. With no other proxy the drain has nowhere to hand the
// namespace off, which the admin's watch says: the hook ends at once with success, not at its timeout; the
// runner stops serving it, and the sidecar, finding the runner gone, releases its lease at once. Every
// container exits 0 and the admin lists no lease as soon as the sidecar has exited.
func TestLastRunnerStopsCleanly(t *testing.T) {
	files := []string{"testdata/defaults.yaml", "testdata/last-runner.yaml"}
	c, _ := runChart(t, files, "")
	runner := c.podNamed(releaseName + "-runner-0")
	cc := c.operator(c.podNamed(adminName + "-0"))
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ns = "audit"
	if _, err := adminv1.NewControlPlaneClient(cc).CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{
		Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"audit.events"}},
	}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	admin := adminv1.NewAdminClient(cc)
	mailbox := ns + "@" + runner.name
	c.await("the runner's lease of "+mailbox, 60*time.Second, func() error {
		ls, err := leases(admin)
		if err != nil || !slices.ContainsFunc(ls, func(l *adminv1.Lease) bool { return l.GetMailboxId() == mailbox }) {
			return fmt.Errorf("leases %v, err %v", ls, err)
		}
		return nil
	})

	began := time.Now()
	hook, out, hookErr := c.preStop(runner, "runner")
	t.Logf("preStop %q: %v after %v:\n%s", hook, hookErr, time.Since(began).Round(time.Millisecond), out)
	if hookErr != nil {
		t.Fatalf("preStop hook failed: %v", hookErr)
	}
	// The drain's timeout is 60 s (testdata/last-runner.yaml): a hook that
	// waited it out did not see that nothing can take the namespace.
	if took := time.Since(began); took > 20*time.Second {
		t.Fatalf("preStop hook took %v with nowhere to hand off, want it to end once the admin says so", took)
	}
	grace := time.Duration(*runner.spec.TerminationGracePeriodSeconds) * time.Second
	codes := map[string]int{}
	for _, name := range []string{"runner", inject.ContainerName} {
		p := c.proc(runner, name)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace - time.Since(began)):
			t.Fatalf("%s/%s still running at the end of the grace period (%v)", runner.name, name, grace)
		}
		codes[name] = p.cmd.ProcessState.ExitCode()
	}
	exited := time.Now()
	ls, err := leases(admin)
	t.Logf("pod stopped in %v: exit codes %v; leases after: %v (err %v)", exited.Sub(began).Round(time.Millisecond), codes, ls, err)
	for name, code := range codes {
		if code != 0 {
			t.Errorf("%s/%s exited %d, want 0:\n%s", runner.name, name, code, c.tail(runner, name))
		}
	}
	if err != nil || len(ls) != 0 {
		t.Errorf("leases once the pod stopped: %v (err %v), want none", ls, err)
	}
}

// leases lists every lease the admin holds, linearizably.
func leases(admin adminv1.AdminClient) ([]*adminv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := admin.ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	return resp.GetLeases(), err
}

// proc is the running process of container name in pod p.
func (c *cluster) proc(p *pod, name string) *proc {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pr := range c.procs {
		if pr.pod == p && pr.container == name {
			return pr
		}
	}
	c.t.Fatalf("no process for %s/%s", p.name, name)
	return nil
}

// tail is the end of container name's log in pod p.
func (c *cluster) tail(p *pod, name string) string {
	b, _ := os.ReadFile(c.proc(p, name).log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// preStop runs container name's rendered preStop exec hook in pod p as the kubelet does: in the container,
// with its environment, as the pod's user, the prism binary where the image has it; it returns the command,
// its output and how it ended.
func (c *cluster) preStop(p *pod, name string) ([]string, []byte, error) {
	c.t.Helper()
	i := slices.IndexFunc(p.spec.Containers, func(ctr corev1.Container) bool { return ctr.Name == name })
	if i < 0 {
		c.t.Fatalf("pod %s has no container %s", p.name, name)
	}
	ctr := p.spec.Containers[i]
	if ctr.Lifecycle == nil || ctr.Lifecycle.PreStop == nil || ctr.Lifecycle.PreStop.Exec == nil {
		c.t.Fatalf("%s/%s has no preStop exec hook", p.name, name)
	}
	env, vars := p.env(c.t, ctr)
	var argv []string
	for _, a := range ctr.Lifecycle.PreStop.Exec.Command {
		argv = append(argv, expand(a, vars))
	}
	spec := podproc.Container{Argv: argv, Env: env, Hosts: c.hosts, UID: -1,
		Mounts: []podproc.Mount{{Source: c.bin, Target: binDir, ReadOnly: true}}}
	if psc := p.spec.SecurityContext; psc != nil && psc.RunAsUser != nil {
		spec.UID, spec.GID = int(*psc.RunAsUser), int(*psc.RunAsUser)
		if psc.RunAsGroup != nil {
			spec.GID = int(*psc.RunAsGroup)
		}
	}
	cmd, err := p.net.Command(spec)
	if err != nil {
		c.t.Fatal(err)
	}
	// The kubelet ends a hook still running at the grace period's end.
	kill := time.AfterFunc(time.Duration(*p.spec.TerminationGracePeriodSeconds)*time.Second, func() { _ = cmd.Process.Kill() })
	defer kill.Stop()
	out, err := cmd.CombinedOutput()
	return argv, out, err
}
