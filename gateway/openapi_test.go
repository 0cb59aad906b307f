package gateway_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/testkit/openapitest"
	"github.com/prism-mesh/prism/xds/ir"
)

// TestGatewayAnswersAsDocumented holds the gateway's HTTP door to the
// query API's OpenAPI document: both path families with their filters, the
// refusals it makes itself (400, 404, 405), a runner that hangs (504) or is
// gone (503), and /openapi.json.
func TestGatewayAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.extra = []ir.Proxy{{ID: "proxy-h", RunnerID: "runner-h", Address: hang(t), Healthy: true}}
	m.cp.Namespaces.Set("$admin", "$admin@proxy-b", 6)
	m.cp.Namespaces.Set("audit", "audit@proxy-a", 5)
	m.publish(1)
	m.run(t)
	c := openapitest.New(t)
	client := &http.Client{Timeout: 2 * upstreamTimeout}

	check := func(method, path string, valid bool, want int) openapitest.Exchange {
		t.Helper()
		req, err := http.NewRequest(method, m.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		ex := c.Do(t, client, req, valid)
		if ex.Status != want {
			t.Fatalf("%s %s = %d %q, want %d", method, path, ex.Status, ex.Body, want)
		}
		return ex
	}
	for _, base := range []string{"/v1/namespaces/%24admin", "/v1/namespaces/$admin", "/v1/mailboxes/$admin@proxy-b", "/v1/mailboxes/audit@proxy-a", "/v1/namespaces/audit"} {
		check("GET", base+"/events", true, 200)
		check("GET", base+"/events?topic=b.events,a.events&principal=nobody&correlation_id=c&trace_id=t&start=2001-09-09T01:46:40Z&end=1000000000004&limit=2", true, 200)
		check("GET", base+"/stats", true, 200)
		event := http.StatusNotFound // audit holds a.events only
		if strings.Contains(base, "admin") {
			event = http.StatusOK
		}
		check("GET", base+"/events/b.events-3", true, event)
		check("GET", base+"/events?limit=-1", false, 400)
		check("GET", base+"/events?end=0&start=1", false, 400)
		check("POST", base+"/events", false, 405)
		check("DELETE", base+"/stats", false, 405)
	}

	// Pages through the gateway: the token the runner gave round trips.
	var ids []string
	token := ""
	for range 10 {
		path := "/v1/namespaces/$admin/events?limit=2"
		if token != "" {
			path += "&page_token=" + token
		}
		body := check("GET", path, true, 200).JSON(t)
		for _, it := range body["items"].([]any) {
			ids = append(ids, it.(map[string]any)["message_id"].(string))
		}
		if token, _ = body["next_page_token"].(string); token == "" {
			break
		}
	}
	if fmt.Sprint(ids) != "[b.events-4 b.events-3 b.events-2 b.events-1 b.events-0]" {
		t.Errorf("pages by namespace gave %v", ids)
	}

	for _, path := range []string{"/v1/namespaces/nobody/events", "/v1/namespaces/nobody/stats", "/v1/mailboxes/nobody@proxy-z/events/m-1"} {
		check("GET", path, true, 404)
	}
	check("GET", "/v1/nowhere", false, 404)

	ex := check("GET", "/openapi.json", true, 200)
	if !bytes.Equal(ex.Body, httpapi.OpenAPI()) {
		t.Errorf("/openapi.json is not the document httpapi holds")
	}

	check("GET", "/v1/mailboxes/stuck@proxy-h/stats", true, 504)
	m.a.Close()
	check("GET", "/v1/namespaces/audit/stats", true, 503)

	for op, statuses := range map[string][]int{
		"queryNamespaceEvents": {200, 400, 404},
		"getNamespaceEvent":    {200, 404},
		"getNamespaceStats":    {200, 404, 503},
		"getStats":             {200, 504},
	} {
		for _, s := range statuses {
			if !c.Answered(op, s) {
				t.Errorf("%s never answered %d", op, s)
			}
		}
	}
}

// TestGatewayRefusalsAsDocumented: with query tokens required, refusals are
// the documented 401 (with its challenge) and 403, and the document itself
// is served without a token.
func TestGatewayRefusalsAsDocumented(t *testing.T) {
	t.Parallel()
	m := startAuthMesh(t)
	c := openapitest.New(t)
	client := m.httpClient("")
	for _, tc := range []struct {
		name, token, path string
		want              int
	}{
		{"the document, no token", "", "/openapi.json", 200},
		{"no token", "", "/v1/mailboxes/demo@p1/events", 401},
		{"malformed token", "abc.def", "/v1/namespaces/demo/stats", 401},
		{"expired", token(t, m.key, func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() }, "demo"), "/v1/mailboxes/demo@p1/events/m-1", 401},
		{"another namespace", token(t, m.key, nil, "other"), "/v1/mailboxes/demo@p1/events?limit=1", 403},
		{"another namespace by alias", token(t, m.key, nil, "other"), "/v1/namespaces/demo/events", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, m.httpURL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if ex := c.Do(t, client, req, true); ex.Status != tc.want {
				t.Fatalf("GET %s = %d %q, want %d", tc.path, ex.Status, ex.Body, tc.want)
			}
		})
	}
	for _, op := range []string{"queryEvents", "getEvent", "getNamespaceStats"} {
		if !c.Answered(op, http.StatusUnauthorized) {
			t.Errorf("%s never answered 401", op)
		}
	}
	if !c.Answered("queryEvents", http.StatusForbidden) || !c.Answered("getOpenAPI", http.StatusOK) {
		t.Error("403 or /openapi.json not seen")
	}
}
