package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// mailbox names the baselines' key for worker w's i-th lease; etcd and
// Redis have no placement to satisfy.
func mailbox(w, i int) string { return fmt.Sprintf("bench@w%d-%d", w, i) }

// etcdLatency runs the lease workload against a 3-member etcd: acquire is
// LeaseGrant plus a put-if-absent with the lease (a Txn, so it is exclusive
// like ours), heartbeat is KeepAliveOnce, release is Revoke.
func etcdLatency(ctx context.Context, o options, dir string) error {
	if o.etcd == "" {
		return nil
	}
	c, cli, err := serveEtcd(ctx, o, dir)
	if err != nil {
		return err
	}
	defer c.stop()
	defer cli.Close()
	leases := make([][]clientv3.LeaseID, o.concurrency)
	r, rate := phase(o, func(w, i int) (bool, bool) {
		g, err := cli.Grant(ctx, 3600)
		if err != nil {
			return false, true
		}
		key := mailbox(w, i)
		t, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, fmt.Sprintf("w%d", w), clientv3.WithLease(g.ID))).Commit()
		if err != nil || !t.Succeeded {
			return false, true
		}
		leases[w] = append(leases[w], g.ID)
		return true, true
	})
	report("admin", "etcd_acquire", "", r, rate)
	r, rate = phase(o, func(w, i int) (bool, bool) {
		if len(leases[w]) == 0 {
			return false, false
		}
		_, err := cli.KeepAliveOnce(ctx, leases[w][i%len(leases[w])])
		return err == nil, true
	})
	report("admin", "etcd_heartbeat", "", r, rate)
	r, rate = phase(o, func(w, i int) (bool, bool) {
		if i >= len(leases[w]) {
			return false, false
		}
		_, err := cli.Revoke(ctx, leases[w][i])
		return err == nil, i+1 < len(leases[w])
	})
	report("admin", "etcd_release", "", r, rate)
	return nil
}

// serveEtcd starts a 3-member etcd and returns a client once it serves.
func serveEtcd(ctx context.Context, o options, dir string) (*etcdCluster, *clientv3.Client, error) {
	c, err := startEtcd(o.etcd, dir, 3)
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.stop()
		return nil, nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(sctx, "warmup", "x")
		cancel()
		if err == nil {
			return c, cli, nil
		}
		if time.Now().After(deadline) {
			cli.Close()
			c.stop()
			return nil, nil, fmt.Errorf("etcd never served: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// etcdKeepAlive is the baseline of a session: etcd's one lease with as many
// keys as a session holds leases, renewed by one KeepAliveOnce, timed over
// -bulk-reps*20 renewals one after another.
func etcdKeepAlive(ctx context.Context, o options, dir string) error {
	if o.etcd == "" {
		return nil
	}
	c, cli, err := serveEtcd(ctx, o, dir)
	if err != nil {
		return err
	}
	defer c.stop()
	defer cli.Close()
	g, err := cli.Grant(ctx, int64(o.sessionTTL/time.Second))
	if err != nil {
		return fmt.Errorf("etcd grant: %w", err)
	}
	// Concurrent puts ride etcd's batching; a Txn is capped at 128 ops.
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < o.sessionLeases; i = int(next.Add(1)) - 1 {
				if _, err := cli.Put(ctx, mailbox(0, i), "w0", clientv3.WithLease(g.ID)); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("etcd: %d of %d puts with the lease failed", f, o.sessionLeases)
	}
	r := &recorder{}
	for range o.bulkReps * 20 {
		t0 := time.Now()
		if _, err := cli.KeepAliveOnce(ctx, g.ID); err != nil {
			r.errs.Add(1)
			continue
		}
		r.add(time.Since(t0))
	}
	bench(fmt.Sprintf("admin.etcd_keepalive_p50_ms_%dkeys", o.sessionLeases), ms(r.pct(0.5)), "ms")
	bench(fmt.Sprintf("admin.etcd_keepalive_p99_ms_%dkeys", o.sessionLeases), ms(r.pct(0.99)), "ms")
	if e := r.errs.Load(); e > 0 {
		fmt.Fprintf(os.Stderr, "# etcd keepalive: %d failed\n", e)
	}
	return nil
}

// redisLatency runs the usual Redis lease primitives against one redis-server with
// appendfsync always (durable like the others): SET NX PX, PEXPIRE, DEL.
func redisLatency(ctx context.Context, o options, dir string) error {
	if o.redis == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	addr := freeAddr()
	host, port := addr[:len("127.0.0.1")], addr[len("127.0.0.1:"):]
	p := &proc{name: "redis", bin: o.redis, log: filepath.Join(dir, "redis.log"), args: []string{
		"--bind", host, "--port", port, "--dir", dir, "--dbfilename", "bench.rdb", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--appendfilename", "bench.aof",
	}}
	if err := p.start(); err != nil {
		return err
	}
	defer p.kill()
	cli := redis.NewClient(&redis.Options{Addr: addr, PoolSize: o.concurrency})
	defer cli.Close()
	for deadline := time.Now().Add(30 * time.Second); cli.Ping(ctx).Err() != nil; {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis never answered on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	acquired := make([]int, o.concurrency)
	r, rate := phase(o, func(w, i int) (bool, bool) {
		ok, err := cli.SetNX(ctx, mailbox(w, i), fmt.Sprintf("w%d", w), time.Hour).Result()
		if err == nil && ok {
			acquired[w] = i + 1
		}
		return err == nil && ok, true
	})
	report("admin", "redis_acquire", "", r, rate)
	r, rate = phase(o, func(w, i int) (bool, bool) {
		if acquired[w] == 0 {
			return false, false
		}
		ok, err := cli.PExpire(ctx, mailbox(w, i%acquired[w]), time.Hour).Result()
		return err == nil && ok, true
	})
	report("admin", "redis_heartbeat", "", r, rate)
	r, rate = phase(o, func(w, i int) (bool, bool) {
		if i >= acquired[w] {
			return false, false
		}
		n, err := cli.Del(ctx, mailbox(w, i)).Result()
		return err == nil && n == 1, i+1 < acquired[w]
	})
	report("admin", "redis_release", "", r, rate)
	return nil
}
