package httpapi

import (
	_ "embed"
	"fmt"
	"net/http"

	"sigs.k8s.io/yaml"
)

// openAPIYAML describes the API this package renders; it is kept in YAML
// for review and served as JSON, the form clients and tools fetch.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIJSON is the document as served. The YAML is part of the binary,
// so failing to convert it is a build mistake the package's tests catch,
// like a regexp.MustCompile of a constant.
var openAPIJSON = mustJSON(openAPIYAML)

func mustJSON(y []byte) []byte {
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		panic(fmt.Sprintf("httpapi: openapi.yaml: %v", err))
	}
	return j
}

// OpenAPI returns the OpenAPI 3 document of the query API as JSON. The
// caller must not modify it.
func OpenAPI() []byte { return openAPIJSON }

// ServeOpenAPI answers GET /openapi.json with the document. It needs no
// credentials: it says what the API is, not what any mailbox holds.
func ServeOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPIJSON) // the client went away; nothing to tell it
}
