package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestMailboxDevAdminTrail follows the $admin curl line `prism dev` prints:
// through the gateway it answers the admin's own changes, among them the
// demo namespace's creation under the identity of the operator prism dev
// issued, and the leader's creation of $admin under the admin's.
func TestMailboxDevAdminTrail(t *testing.T) {
	t.Parallel()
	d := startDev(t, "--demo=false")
	out := d.output()
	gw := d.addrs["--gateway-addr"]
	m := regexp.MustCompile(`curl -s '(http://` + regexp.QuoteMeta(gw) + `/v1/namespaces/\$admin/events\?limit=5)'`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no $admin curl line through the gateway %s in:\n%s", gw, out)
	}
	type item struct {
		Principal     string            `json:"principal"`
		CustomHeaders map[string]string `json:"custom_headers"`
	}
	testwait.For(t, 60*time.Second, "the demo namespace's creation in $admin", func() (bool, string) {
		resp, err := http.Get(strings.Replace(m[1], "limit=5", "limit=100&topic=admin.namespace.created", 1))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var body struct {
			Items []item `json:"items"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
			return false, fmt.Sprint(resp.StatusCode, err)
		}
		var demo, admin bool
		for _, it := range body.Items {
			switch it.CustomHeaders["resource"] {
			case "demo":
				demo = strings.Contains(it.Principal, "/operator/")
			case "$admin":
				admin = it.Principal == "prism-admin"
			}
		}
		return demo && admin, fmt.Sprintf("%+v", body.Items)
	})
}
