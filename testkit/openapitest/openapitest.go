// Package openapitest holds real HTTP exchanges with the query API to its
// OpenAPI document (httpapi.OpenAPI) with kin-openapi: the tests of the
// runner's and the gateway's handlers send their requests through a Checker,
// which fails the test when an answer's status, headers or body is not what
// the document says, so the document cannot drift from the code.
package openapitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
)

// Load parses the served document and validates it as OpenAPI 3.
func Load() (*openapi3.T, error) { return Parse(httpapi.OpenAPI()) }

// Parse loads an OpenAPI document (JSON or YAML), resolving its references,
// and validates it.
func Parse(data []byte) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	return doc, nil
}

// Checker sends requests and validates them and their answers against the
// document, recording what it saw for coverage checks.
type Checker struct {
	Doc    *openapi3.T
	router routers.Router

	mu       sync.Mutex
	statuses map[string]map[int]bool // operationId -> statuses answered
	params   map[string]bool         // query parameters sent in valid requests
}

// New loads the document and routes requests to any host: the servers it
// names are examples, the tests' servers listen on ephemeral ports.
func New(t testing.TB) *Checker {
	t.Helper()
	doc, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	routed := *doc
	routed.Servers = nil
	r, err := gorillamux.NewRouter(&routed)
	if err != nil {
		t.Fatalf("route openapi.json: %v", err)
	}
	return &Checker{Doc: doc, router: r, statuses: map[string]map[int]bool{}, params: map[string]bool{}}
}

// Exchange is one request and its answer.
type Exchange struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the answer's body into a map.
func (e Exchange) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(e.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %q", err, e.Body)
	}
	return m
}

// Do sends req with client and fails t unless the answer is one the
// document allows for it. validRequest says req is meant to be a request the
// document allows, which is checked too; a request meant to be refused is
// sent as it is, its answer still checked. A method the document does not
// list for a known path must be answered as components.responses
// .MethodNotAllowed says, a path it does not know 404 with the error body.
func (c *Checker) Do(t testing.TB, client *http.Client, req *http.Request, validRequest bool) Exchange {
	t.Helper()
	route, pathParams, routeErr := c.router.FindRoute(req)
	var in *openapi3filter.RequestValidationInput
	if routeErr == nil {
		in = &openapi3filter.RequestValidationInput{
			Request: req, PathParams: pathParams, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: bearer, MultiError: true, SkipSettingDefaults: true},
		}
		if validRequest {
			if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
				t.Fatalf("%s %s: the request does not match the document: %v", req.Method, req.URL, err)
			}
			c.sent(req)
		}
	} else if validRequest {
		t.Fatalf("%s %s: not in the document: %v", req.Method, req.URL, routeErr)
	}

	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	ex := Exchange{Status: resp.StatusCode, Header: resp.Header, Body: body}

	switch {
	case routeErr == nil:
		out := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
		}
		err := openapi3filter.ValidateResponse(req.Context(), out.SetBodyBytes(body))
		if err != nil {
			t.Fatalf("%s %s answered %d %s %q, which the document does not allow: %v", req.Method, req.URL, resp.StatusCode, resp.Header, body, err)
		}
		c.answered(route.Operation.OperationID, resp.StatusCode)
	case errors.Is(routeErr, routers.ErrMethodNotAllowed):
		c.checkOutside(t, req, ex, http.StatusMethodNotAllowed, "MethodNotAllowed")
	default:
		c.checkOutside(t, req, ex, http.StatusNotFound, "")
	}
	return ex
}

// checkOutside checks an answer to a request no operation describes: the
// status, the headers of the named component response, and the error body.
func (c *Checker) checkOutside(t testing.TB, req *http.Request, ex Exchange, status int, response string) {
	t.Helper()
	if ex.Status != status {
		t.Fatalf("%s %s answered %d, want %d for a request outside the document: %q", req.Method, req.URL, ex.Status, status, ex.Body)
	}
	if response != "" {
		ref := c.Doc.Components.Responses[response]
		if ref == nil || ref.Value == nil {
			t.Fatalf("components.responses.%s is missing", response)
		}
		for name, h := range ref.Value.Headers {
			v := ex.Header.Get(name)
			if v == "" {
				t.Fatalf("%s %s: no %s header, which components.responses.%s lists", req.Method, req.URL, name, response)
			}
			if err := h.Value.Schema.Value.VisitJSON(v); err != nil {
				t.Fatalf("%s %s: header %s: %v", req.Method, req.URL, name, err)
			}
		}
	}
	if ct := ex.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q, want application/json", req.Method, req.URL, ct)
	}
	var body any
	if err := json.Unmarshal(ex.Body, &body); err != nil {
		t.Fatalf("%s %s: body is not JSON: %q", req.Method, req.URL, ex.Body)
	}
	if err := c.Doc.Components.Schemas["Error"].Value.VisitJSON(body); err != nil {
		t.Fatalf("%s %s: body %q is not an Error: %v", req.Method, req.URL, ex.Body, err)
	}
}

// RequestError is what the document says is wrong with req: nil when it
// allows req, the routing error when it has no operation for it.
func (c *Checker) RequestError(req *http.Request) error {
	route, pathParams, err := c.router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	return openapi3filter.ValidateRequest(req.Context(), &openapi3filter.RequestValidationInput{
		Request: req, PathParams: pathParams, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearer, MultiError: true, SkipSettingDefaults: true},
	})
}

func (c *Checker) sent(req *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range req.URL.Query() {
		c.params[k] = true
	}
}

func (c *Checker) answered(op string, status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.statuses[op] == nil {
		c.statuses[op] = map[int]bool{}
	}
	c.statuses[op][status] = true
}

// Answered reports whether operation op answered status in a checked
// exchange.
func (c *Checker) Answered(op string, status int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statuses[op][status]
}

// Sent reports whether query parameter name was in a valid request.
func (c *Checker) Sent(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.params[name]
}

// bearer accepts a request for the bearer scheme when it carries a bearer
// token; whether the token is good is the gateway's to say (401), not the
// document's.
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.SecurityScheme.Type == "http" && in.SecurityScheme.Scheme == "bearer" {
		if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
			return errors.New("no bearer token")
		}
		return nil
	}
	return fmt.Errorf("security scheme %q is not in the document", in.SecuritySchemeName)
}
