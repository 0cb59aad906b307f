package fsm

import (
	"errors"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// A command added to Command.body without a handler fails here rather than
// as ErrUnknownCommand on a live cluster.
func TestEveryCommandHasAHandler(t *testing.T) {
	t.Parallel()
	fields := bodyOneof.Fields()
	if len(handlers) != fields.Len() {
		t.Errorf("%d handlers for %d command bodies", len(handlers), fields.Len())
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		t.Run(string(fd.Name()), func(t *testing.T) {
			t.Parallel()
			m := (&adminv1.Command{}).ProtoReflect()
			m.Set(fd, m.NewField(fd))
			cmd := m.Interface().(*adminv1.Command)
			h, err := lookup(cmd)
			if err != nil {
				t.Fatalf("no handler: %v", err)
			}
			if h.validate == nil || h.apply == nil {
				t.Fatal("handler lacks validate or apply")
			}
			if got := CommandType(cmd); got != string(fd.Name()) {
				t.Fatalf("CommandType = %q", got)
			}
		})
	}
}

// ValidateBody is what a follower checks before forwarding: everything
// Validate checks except the leader's timestamp, which it cannot have yet.
func TestValidateBodyNeedsNoLeaderTime(t *testing.T) {
	t.Parallel()
	unstamped := func(cmd *adminv1.Command) *adminv1.Command { cmd.Now = nil; return cmd }
	cases := []struct {
		name          string
		cmd           *adminv1.Command
		body, stamped error
	}{
		{"good body, no time", unstamped(c(0, acquire("a@p", "r"))), nil, ErrInvalid},
		{"good body, time", c(0, acquire("a@p", "r")), nil, nil},
		{"bad body, no time", unstamped(c(0, acquire("a", "r"))), ErrInvalid, ErrInvalid},
		{"no body", &adminv1.Command{Now: at(0)}, ErrUnknownCommand, ErrUnknownCommand},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := ValidateBody(tc.cmd); !errors.Is(err, tc.body) {
				t.Errorf("ValidateBody = %v, want %v", err, tc.body)
			}
			if err := Validate(tc.cmd); !errors.Is(err, tc.stamped) {
				t.Errorf("Validate = %v, want %v", err, tc.stamped)
			}
		})
	}
}
