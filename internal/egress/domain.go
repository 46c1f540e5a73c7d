package egress

import (
	"fmt"
	"strings"
)

// Limits of DNS names (RFC 1035 §2.3.4).
const (
	maxNameLen  = 253
	maxLabelLen = 63
)

// normDomain validates a domain pattern and returns it lower-case without a trailing dot. With
// wildcards, "*" (every hostname) and a single leading "*." (strict subdomains) are accepted;
// without, s must be a plain hostname.
func normDomain(s string, wildcards bool) (string, error) {
	d := strings.ToLower(s)
	if wildcards && d == "*" {
		return d, nil
	}
	prefix := ""
	if wildcards && strings.HasPrefix(d, "*.") {
		prefix, d = "*.", d[2:]
	}
	// A trailing dot (a fully qualified name) names the same host; Host headers and SNI carry
	// names without it, so keeping it would make the entry never match.
	d = strings.TrimSuffix(d, ".")
	if err := checkHostname(d); err != nil {
		return "", err
	}
	return prefix + d, nil
}

// checkHostname checks RFC 1123 host name syntax, lower-case. Underscores are tolerated because
// real hostnames carry them (and SNI does too); an all-numeric last label is not, so that a
// mistyped address such as "10.0.0" is never taken for a name.
func checkHostname(d string) error {
	if d == "" {
		return fmt.Errorf("the name is empty")
	}
	if len(d) > maxNameLen {
		return fmt.Errorf("the name is longer than %d characters", maxNameLen)
	}
	labels := strings.Split(d, ".")
	for _, l := range labels {
		if l == "" {
			return fmt.Errorf("the name has an empty label")
		}
		if len(l) > maxLabelLen {
			return fmt.Errorf("label %s is longer than %d characters", quote(l), maxLabelLen)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %s starts or ends with '-'", quote(l))
		}
		for _, c := range l {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c == '*':
				return fmt.Errorf("'*' is only allowed as the whole first label (*.example.com)")
			case c > 0x7f:
				return fmt.Errorf("internationalized names must be given in their ASCII (xn--) form")
			default:
				return fmt.Errorf("character %q is not allowed in a domain name", c)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("the last label is all digits")
	}
	return nil
}
