package fsm

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/encoding/protodelim"
)

func member(id, addr string) *adminv1.MemberAddress {
	return &adminv1.MemberAddress{Id: id, GrpcAddress: addr}
}

func TestMembersTable(t *testing.T) {
	t.Parallel()
	boot := &adminv1.PutMembersCommand{OnlyAbsent: true, Members: []*adminv1.MemberAddress{
		member("n1", "127.0.0.1:7001"), member("n2", "127.0.0.1:7002"), member("n3", "127.0.0.1:7003"),
	}}
	cases := []struct {
		name    string
		cmds    []any
		wantErr error
		want    map[string]string
	}{
		{
			name: "bootstrap rows",
			cmds: []any{boot},
			want: map[string]string{"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"},
		},
		{
			name: "bootstrap repeated by a later leader changes nothing",
			cmds: []any{boot, &adminv1.PutMembersCommand{Members: []*adminv1.MemberAddress{member("n4", "127.0.0.1:7004")}}, boot},
			want: map[string]string{"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003", "n4": "127.0.0.1:7004"},
		},
		{
			name: "only_absent never overwrites an AddVoter row",
			cmds: []any{
				&adminv1.PutMembersCommand{Members: []*adminv1.MemberAddress{member("n2", "10.0.0.2:7002")}},
				boot,
			},
			want: map[string]string{"n1": "127.0.0.1:7001", "n2": "10.0.0.2:7002", "n3": "127.0.0.1:7003"},
		},
		{
			name: "AddVoter row replaces the address",
			cmds: []any{boot, &adminv1.PutMembersCommand{Members: []*adminv1.MemberAddress{member("n3", "127.0.0.1:7333")}}},
			want: map[string]string{"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7333"},
		},
		{
			name: "remove drops the row, removing again is a no-op",
			cmds: []any{boot, &adminv1.RemoveMemberCommand{Id: "n2"}, &adminv1.RemoveMemberCommand{Id: "n2"}},
			want: map[string]string{"n1": "127.0.0.1:7001", "n3": "127.0.0.1:7003"},
		},
		{
			name:    "no members",
			cmds:    []any{&adminv1.PutMembersCommand{}},
			wantErr: ErrInvalid,
			want:    map[string]string{},
		},
		{
			name:    "bad address",
			cmds:    []any{&adminv1.PutMembersCommand{Members: []*adminv1.MemberAddress{member("n1", "no-port")}}},
			wantErr: ErrInvalid,
			want:    map[string]string{},
		},
		{
			name: "duplicate id",
			cmds: []any{&adminv1.PutMembersCommand{Members: []*adminv1.MemberAddress{
				member("n1", "127.0.0.1:1"), member("n1", "127.0.0.1:2"),
			}}},
			wantErr: ErrInvalid,
			want:    map[string]string{},
		},
		{
			name:    "remove without id",
			cmds:    []any{&adminv1.RemoveMemberCommand{}},
			wantErr: ErrInvalid,
			want:    map[string]string{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			for i, body := range tc.cmds {
				before := tables(t, h.f)
				res := h.apply(c(0, body))
				err, isErr := res.(error)
				last := i == len(tc.cmds)-1
				switch {
				case isErr && (!last || !errors.Is(err, tc.wantErr)):
					t.Fatalf("command %d: %v, want error %v", i, err, tc.wantErr)
				case !isErr && last && tc.wantErr != nil:
					t.Fatalf("command %d applied, want error %v", i, tc.wantErr)
				case isErr && !bytes.Equal(before, tables(t, h.f)):
					t.Fatal("refused command changed state")
				}
			}
			got, _ := h.f.MemberAddresses()
			if !maps.Equal(got, tc.want) {
				t.Fatalf("members = %v, want %v", got, tc.want)
			}
			for id, addr := range tc.want {
				if a := h.f.MemberAddress(id); a != addr {
					t.Fatalf("MemberAddress(%s) = %q, want %q", id, a, addr)
				}
			}
			if got, _ := roundTrip(t, h.f).MemberAddresses(); !maps.Equal(got, tc.want) {
				t.Fatalf("restored members = %v, want %v", got, tc.want)
			}
		})
	}
}

// A snapshot whose header promises a member row it does not hold is refused.
func TestRestoreRefusesMissingMembers(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if _, err := protodelim.MarshalTo(&buf, &adminv1.SnapshotHeader{Format: snapshotFormat, MemberCount: 1}); err != nil {
		t.Fatal(err)
	}
	if err := New().Restore(io.NopCloser(&buf)); err == nil {
		t.Fatal("restore accepted a snapshot without its member row")
	}
}
