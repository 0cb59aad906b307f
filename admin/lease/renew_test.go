package lease

import (
	"errors"
	"testing"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func TestValidateRenew(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		req  *adminv1.MailboxHeartbeatRequest
		ok   bool
	}{
		{"valid", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{EventsStored: 1}}, true},
		{"no stats", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r"}, true},
		{"bad mailbox", &adminv1.MailboxHeartbeatRequest{MailboxId: "a", RunnerId: "r"}, false},
		{"no runner", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p"}, false},
		{"negative counter", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{StorageBytes: -1}}, false},
		{"unknown health", &adminv1.MailboxHeartbeatRequest{MailboxId: "a@p", RunnerId: "r", Stats: &adminv1.LeaseStats{Health: 9}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateRenew(tc.req)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, fsm.ErrInvalid)) {
				t.Fatalf("ValidateRenew = %v", err)
			}
		})
	}
}
