package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	return r.ReadString('\n')
}

func TestForwards(t *testing.T) {
	t.Parallel()
	p := newProxy(t)
	c, r := dial(t, p)
	got, err := roundTrip(c, r, "hello", 10*time.Second)
	if err != nil || got != "hello\n" {
		t.Fatalf("echo = %q, %v", got, err)
	}
}

func TestBlackholeStallsExistingAndNewConnectionsUntilRestore(t *testing.T) {
	t.Parallel()
	p := newProxy(t)
	old, oldR := dial(t, p)
	if _, err := roundTrip(old, oldR, "warm", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if !p.Blackholed() {
		t.Fatal("not blackholed")
	}
	if _, err := roundTrip(old, oldR, "lost?", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("existing connection passed traffic through a blackhole: %v", err)
	}
	fresh, freshR := dial(t, p)
	if _, err := roundTrip(fresh, freshR, "new", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection passed traffic through a blackhole: %v", err)
	}
	p.Restore()
	_ = old.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := oldR.ReadString('\n'); err != nil || got != "lost?\n" {
		t.Fatalf("held data after restore = %q, %v", got, err)
	}
	_ = fresh.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := freshR.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("new connection after restore = %q, %v", got, err)
	}
}

func TestCutAllClosesConnections(t *testing.T) {
	t.Parallel()
	p := newProxy(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "x", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.CutAll()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection survived CutAll: %v", err)
	}
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "again", 10*time.Second); err != nil || got != "again\n" {
		t.Fatalf("after CutAll = %q, %v", got, err)
	}
}

func TestUpstreamDownClosesClient(t *testing.T) {
	t.Parallel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	p, err := New("127.0.0.1:0", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "x", 10*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("want closed connection, got %v", err)
	}
}
