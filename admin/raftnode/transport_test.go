package raftnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// rpcStream is the stream layer of an outside client of the raft port: it
// dials as it is told and never serves.
type rpcStream struct {
	net.Listener
	dial func(addr string) (net.Conn, error)
}

func (s rpcStream) Dial(addr raft.ServerAddress, _ time.Duration) (net.Conn, error) {
	return s.dial(string(addr))
}

// outsider is a raft transport that dials with dial, fresh per test case so
// no pooled connection outlives the identity it was opened with.
func outsider(t *testing.T, dial func(addr string) (net.Conn, error)) *raft.NetworkTransport {
	t.Helper()
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: rpcStream{Listener: listen(t), dial: dial}, MaxPool: 1, Timeout: 10 * time.Second,
	})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func tlsDial(cfg *tls.Config) func(string) (net.Conn, error) {
	return func(addr string) (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
		return d.Dial("tcp", addr)
	}
}

func plainDial(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }

// lastLogTerm is the term of n's last log entry.
func lastLogTerm(n *Node) uint64 {
	var term uint64
	_, _ = fmt.Sscan(n.raft.Stats()["last_log_term"], &term)
	return term
}

// takeOver sends target what a usurper would: a vote request and an append
// of key=1, committed at once, both in a term far above the cluster's. It
// returns the term used and the errors of the two RPCs.
func takeOver(tr raft.Transport, target *Node, key string) (uint64, error, error) {
	term := target.Term() + 100
	last := target.raft.LastIndex()
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("usurper"), Addr: []byte(tr.LocalAddr())}
	id, addr := raft.ServerID(target.ID()), raft.ServerAddress(target.Addr())
	var vote raft.RequestVoteResponse
	errVote := tr.RequestVote(id, addr, &raft.RequestVoteRequest{
		RPCHeader: header, Term: term, LastLogIndex: last + 1000, LastLogTerm: term,
	}, &vote)
	var app raft.AppendEntriesResponse
	errAppend := tr.AppendEntries(id, addr, &raft.AppendEntriesRequest{
		RPCHeader: header, Term: term, PrevLogEntry: last, PrevLogTerm: lastLogTerm(target),
		Entries:           []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: []byte(key + "=1")}},
		LeaderCommitIndex: last + 1,
	}, &app)
	return term, errVote, errAppend
}

// TestTLSClusterRefusesOutsiders: a three-node cluster over mutual TLS
// elects and replicates; nobody but a member's admin identity gets an RPC
// through, so an outsider can neither raise the term nor commit an entry.
func TestTLSClusterRefusesOutsiders(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	c := startCluster(&testCluster{t: t, pki: p}, 3)
	ctx := context.Background()
	for k := range 10 {
		c.applyIdempotent(ctx, fmt.Appendf(nil, "k%d=%d", k, k))
	}
	lead := c.leader()
	for i := range c.nodes {
		c.waitValue(i, "k9", "9")
	}

	// A connection that never speaks must hold up neither the accept loop
	// (every case below connects after it) nor a socket for long.
	silent, err := net.Dial("tcp", c.nodes[lead].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	opened := time.Now()

	other := pkitest.New(t)
	cases := []struct {
		name string
		dial func(string) (net.Conn, error)
	}{
		{"plaintext", plainDial},
		{"no client certificate", tlsDial(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})}, //nolint:gosec // the test is about the server's check
		{"member's name from another CA", tlsDial(pkitest.Presented(t, other.Files(identity.Admin, "n1")))},
		{"member's expired certificate", tlsDial(pkitest.Presented(t, p.Expired(identity.Admin, "n1")))},
		{"admin identity that is not a member", tlsDial(p.Source(identity.Admin, "intruder").ClientConfig(pki.Any))},
		{"proxy identity", tlsDial(p.Source(identity.Proxy, "x").ClientConfig(pki.Any))},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("evil%d", ci)
			tr := outsider(t, tc.dial)
			for _, target := range c.nodes {
				start := time.Now()
				term, errVote, errAppend := takeOver(tr, target, key)
				if errVote == nil || errAppend == nil {
					t.Fatalf("%s: vote err %v, append err %v; want both refused", target.ID(), errVote, errAppend)
				}
				if took := time.Since(start); took >= handshakeTimeout {
					t.Errorf("%s: refusal took %v, not closed at once", target.ID(), took)
				}
				for _, n := range c.nodes {
					if got := n.Term(); got >= term {
						t.Errorf("%s: term %d after an outsider sent term %d", n.ID(), got, term)
					}
				}
			}
			for i, n := range c.nodes {
				if v, ok := c.fsms[i].get(key); ok {
					t.Errorf("%s applied the outsider's %s=%s", n.ID(), key, v)
				}
			}
		})
	}

	_ = silent.SetReadDeadline(time.Now().Add(handshakeTimeout + 5*time.Second))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("silent connection: read %v, want the server to close it", err)
	} else if took := time.Since(opened); took > handshakeTimeout+2*time.Second {
		t.Errorf("silent connection closed after %v, handshake timeout is %v", took, handshakeTimeout)
	}

	// The same attack with a member's identity goes through: the refusals
	// above are the transport's doing, not a harmless attack.
	follower := (lead + 1) % len(c.nodes)
	tr := outsider(t, tlsDial(p.Source(identity.Admin, "n1").ClientConfig(pki.Any)))
	term, errVote, errAppend := takeOver(tr, c.nodes[follower], "member")
	if errVote != nil || errAppend != nil {
		t.Fatalf("member's certificate: vote err %v, append err %v", errVote, errAppend)
	}
	if got := c.nodes[follower].Term(); got < term {
		t.Fatalf("member's certificate: term %d, want %d", got, term)
	}
	c.waitValue(follower, "member", "1")
}

// TestTLSMembership: a node waiting to be added trusts only the members it
// was told of; a member's transport refuses a node until it is added and
// after it is removed.
func TestTLSMembership(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	ctx := context.Background()
	a, err := New(Config{ID: "a", DataDir: t.TempDir(), Listener: listen(t), Bootstrap: true, Timing: FastTiming(),
		TLS: p.Source(identity.Admin, "a"), Logger: quietLogger()}, newKV())
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, a)
	waitLeader(t, a)
	if _, _, err := a.Apply(ctx, []byte("before=join")); err != nil {
		t.Fatal(err)
	}
	fsmB := newKV()
	b, err := New(Config{ID: "b", DataDir: t.TempDir(), Listener: listen(t), Timing: FastTiming(),
		TLS: p.Source(identity.Admin, "b"), JoinPeers: []Peer{{ID: "a", Addr: a.Addr()}}, Logger: quietLogger()}, fsmB)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, b)

	asB := func() *raft.NetworkTransport {
		return outsider(t, tlsDial(p.Source(identity.Admin, "b").ClientConfig(pki.Any)))
	}
	// A harmless vote request: the current term, an empty log.
	vote := func(tr raft.Transport, n *Node) error {
		var resp raft.RequestVoteResponse
		return tr.RequestVote(raft.ServerID(n.ID()), raft.ServerAddress(n.Addr()), &raft.RequestVoteRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("b"), Addr: []byte(b.Addr())},
			Term:      n.Term(),
		}, &resp)
	}
	if err := vote(asB(), a); err == nil {
		t.Fatal("a accepted b before b was added")
	}
	intruder := outsider(t, tlsDial(p.Source(identity.Admin, "intruder").ClientConfig(pki.Any)))
	if term, errVote, errAppend := takeOver(intruder, b, "evil"); errVote == nil || errAppend == nil || b.Term() >= term {
		t.Fatalf("joining node: vote err %v, append err %v, term %d after %d; want refused", errVote, errAppend, b.Term(), term)
	}

	if _, err := a.AddVoter(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to replicate", func() bool { v, _ := fsmB.get("before"); return v == "join" })
	if _, ok := fsmB.get("evil"); ok {
		t.Fatal("b applied the intruder's entry")
	}
	if err := vote(asB(), a); err != nil {
		t.Fatalf("a refused b once a member: %v", err)
	}

	if _, err := a.RemoveServer(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := vote(asB(), a); err == nil {
		t.Fatal("a accepted b after b was removed")
	}
}

// TestTLSDialChecksTheServer: raft dials an address, and the server there
// must be the member raft meant, whatever else the CA signed.
func TestTLSDialChecksTheServer(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	self := p.Source(identity.Admin, "a")
	// serve answers handshakes at a fresh address as role/name.
	serve := func(t *testing.T, role identity.Role, name string) string {
		ln := tls.NewListener(listen(t), p.Source(role, name).ServerConfig(pki.Any))
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}
		}()
		return ln.Addr().String()
	}
	cases := []struct {
		name   string
		role   identity.Role
		server string
		peers  func(addr string) ([]raft.Server, map[string]string)
		want   string // "" = accepted, else part of the error
	}{
		{"the member at its address", identity.Admin, "b", at("b"), ""},
		{"another member at its address", identity.Admin, "c", at("b"), "want admin/b"},
		{"its name in another role", identity.Proxy, "b", at("b"), "want admin/b"},
		{"the member at its dial override", identity.Admin, "b", overridden("b"), ""},
		{"another member at its dial override", identity.Admin, "a", overridden("b"), "want admin/b"},
		{"a member where none is known", identity.Admin, "a", nowhere, ""},
		{"a non-member where none is known", identity.Admin, "intruder", nowhere, "not a member"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := serve(t, tc.role, tc.server)
			servers, dial := tc.peers(addr)
			sl := &streamLayer{tls: self, peers: &peerSet{static: servers, dial: dial, log: quietLogger(),
				latest: func() []raft.Server { return nil }}}
			conn, err := sl.Dial(raft.ServerAddress(addr), 5*time.Second)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				_ = conn.Close()
				return
			}
			if err == nil {
				_ = conn.Close()
				t.Fatal("dial accepted the server")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("dial: %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// at places member id at the address dialed, next to a and c elsewhere.
func at(id string) func(string) ([]raft.Server, map[string]string) {
	return func(addr string) ([]raft.Server, map[string]string) {
		return []raft.Server{
			{ID: "a", Address: "127.0.0.1:1"}, {ID: raft.ServerID(id), Address: raft.ServerAddress(addr)}, {ID: "c", Address: "127.0.0.1:3"},
		}, nil
	}
}

// overridden gives member id another address and dials it at addr instead.
func overridden(id string) func(string) ([]raft.Server, map[string]string) {
	return func(addr string) ([]raft.Server, map[string]string) {
		return []raft.Server{{ID: "a", Address: "127.0.0.1:1"}, {ID: raft.ServerID(id), Address: "127.0.0.1:2"}},
			map[string]string{id: addr}
	}
}

func nowhere(string) ([]raft.Server, map[string]string) {
	return []raft.Server{{ID: "a", Address: "127.0.0.1:1"}, {ID: "b", Address: "127.0.0.1:2"}}, nil
}

func TestTLSIdentityMustBeTheNode(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	for _, src := range []*pki.Source{p.Source(identity.Admin, "other"), p.Source(identity.Proxy, "n")} {
		_, err := New(Config{ID: "n", DataDir: t.TempDir(), Listener: listen(t), Bootstrap: true, TLS: src, Logger: quietLogger()}, newKV())
		if err == nil || !strings.Contains(err.Error(), "not admin/n") {
			t.Errorf("TLS identity %s for node n: %v, want refused", src.Identity(), err)
		}
	}
}
