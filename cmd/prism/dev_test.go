package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDevFlagErrors: bad flags fail before anything starts, naming the flag.
func TestDevFlagErrors(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no envoy
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown gateway", []string{"--gateway", "nginx"}, `--gateway "nginx"`},
		{"envoy asked, none on PATH", []string{"--gateway", "envoy"}, "--gateway envoy"},
		{"rate zero", []string{"--rate", "0"}, "--rate must be positive"},
		{"bad log level", []string{"--log-level", "loud"}, "--log-level"},
		{"bad log format", []string{"--log-format", "xml"}, "--log-format"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := devCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
			if strings.Contains(out.String(), "prism dev: starting") {
				t.Fatalf("started anyway:\n%s", out.String())
			}
		})
	}
}
