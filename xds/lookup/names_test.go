package lookup

import (
	"testing"

	"github.com/prism-mesh/prism/xds/translator"
)

// The lookup answers with cluster names and reads paths the translator
// defines; they must stay the same strings.
func TestNamesMatchTheTranslator(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ what, lookup, translator string }{
		{"admin cluster", AdminTarget, translator.AdminCluster},
		{"proxy cluster", ProxyTarget("proxy-01"), translator.ClusterName("proxy-01")},
		{"MailboxQuery prefix", mailboxQueryPrefix, translator.MailboxQueryPrefix},
		{"namespaces prefix", namespacesPrefix, translator.NamespacesPrefix},
	} {
		if tc.lookup != tc.translator {
			t.Errorf("%s: lookup says %q, the translator %q", tc.what, tc.lookup, tc.translator)
		}
	}
}
