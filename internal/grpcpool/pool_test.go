package grpcpool

import "testing"

func TestPoolReusesAndCloses(t *testing.T) {
	t.Parallel()
	var p Pool
	a, err := p.Get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if a != again {
		t.Fatal("second Get for the same address made a new connection")
	}
	b, err := p.Get("127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("two addresses share a connection")
	}
	p.Close()
	fresh, err := p.Get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if fresh == a {
		t.Fatal("Get after Close returned the closed connection")
	}
	p.Close()
}

func TestPoolRejectsBadTarget(t *testing.T) {
	t.Parallel()
	var p Pool
	if _, err := p.Get("dns:///%zz"); err == nil {
		t.Fatal("Get of an unparsable target succeeded")
	}
}
