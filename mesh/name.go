package mesh

// NameRule is the rule for every name a component must route or serve:
// proxy ids, runner ids and (with NamespaceRule's '$') namespaces. It is
// what Envoy's header and path matchers, grpc-go's metadata (printable
// ASCII only) and a URL path segment all carry as they are, with no '@'
// (which ends a namespace in a mailbox id) and nothing to escape but '.'
// in a regex. Refusals state it, so a caller learns the rule, not just
// that a name failed.
const NameRule = "1 to 253 ASCII letters, digits, '.', '_', '~' or '-', starting with a letter or digit"

// NamespaceRule is NameRule with one leading '$' allowed, for namespaces
// such as "$admin" that mark themselves as the system's.
const NamespaceRule = NameRule + ", optionally after one leading '$'"

// ValidName reports whether s follows NameRule. It is matched by hand, not
// with a regexp: the xDS translator checks every proxy of every state with
// it, and the loop is an order of magnitude cheaper.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '~' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// ValidNamespace reports whether s follows NamespaceRule.
func ValidNamespace(s string) bool {
	if len(s) > 1 && s[0] == '$' && len(s) <= MaxIDLen {
		return ValidName(s[1:])
	}
	return ValidName(s)
}

// CheckName checks a new proxy or runner id against NameRule; the error
// wraps ErrInvalid, names field and states the rule.
func CheckName(field, s string) error {
	if !ValidName(s) {
		return invalid(field, "%q must be %s", Echo(s), NameRule)
	}
	return nil
}

// CheckNamespace checks a new namespace against NamespaceRule.
func CheckNamespace(s string) error {
	if !ValidNamespace(s) {
		return invalid("namespace", "%q must be %s", Echo(s), NamespaceRule)
	}
	return nil
}

// CheckMailboxID parses a mailbox id whose parts both follow the rules, as
// a component that routes or serves it needs them.
func CheckMailboxID(s string) (MailboxID, error) {
	id, err := ParseMailboxID(s)
	if err != nil {
		return MailboxID{}, err
	}
	if err := CheckNamespace(id.Namespace); err != nil {
		return MailboxID{}, err
	}
	if err := CheckName("proxy_id", id.Proxy); err != nil {
		return MailboxID{}, err
	}
	return id, nil
}
