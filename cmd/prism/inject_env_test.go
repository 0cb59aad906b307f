package main

import (
	"testing"

	"github.com/prism-mesh/prism/sidecar/inject"
)

// TestInjectedTLSEnvIsWhatTheFlagsRead: the variables the injector sets in
// the sidecar and the runner are the ones their TLS flags default to.
func TestInjectedTLSEnvIsWhatTheFlagsRead(t *testing.T) {
	t.Parallel()
	for injected, read := range map[string]string{inject.EnvTLSCA: envTLSCA, inject.EnvTLSCert: envTLSCert, inject.EnvTLSKey: envTLSKey} {
		if injected != read {
			t.Errorf("injector sets %s, prism reads %s", injected, read)
		}
	}
}
