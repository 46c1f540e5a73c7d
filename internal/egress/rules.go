package egress

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// API limits on header rules (seed "HTTPS header rules", the same as E2B's).
const (
	MaxRuleDomains     = 10
	MaxRuleDomainLen   = 128
	MaxRulesPerDomain  = 1
	MaxHeadersPerRule  = 20
	MaxHeaderNameLen   = 64
	MaxHeaderValueLen  = 2048
	minRuleDomainLen   = 1
	headerTokenSymbols = "!#$%&'*+-.^_`|~"
)

// parseRules validates rules and returns their normal form (lower-case domains) and the policy's
// rules sorted by domain. Domains are visited in sorted order so that the error a client gets for
// several bad entries does not depend on map order.
func parseRules(rules map[string][]Rule) (map[string][]Rule, []HeaderRule, error) {
	if len(rules) == 0 {
		return nil, nil, nil
	}
	if len(rules) > MaxRuleDomains {
		return nil, nil, errdefs.InvalidArgument("network.rules: at most %d rule domains are allowed, got %d", MaxRuleDomains, len(rules))
	}
	norm := make(map[string][]Rule, len(rules))
	var out []HeaderRule
	for _, key := range slices.Sorted(maps.Keys(rules)) {
		field := "network.rules[" + quote(key) + "]"
		if n := len(key); n < minRuleDomainLen || n > MaxRuleDomainLen {
			return nil, nil, errdefs.InvalidArgument("%s: a rule domain must be %d to %d characters long, got %d", field, minRuleDomainLen, MaxRuleDomainLen, n)
		}
		if strings.TrimSpace(key) == "*" {
			return nil, nil, errdefs.InvalidArgument("%s: a bare * is not a rule domain; use an exact name or *.example.com", field)
		}
		domain, err := normDomain(key, true)
		if err != nil {
			return nil, nil, errdefs.InvalidArgument("%s: not a valid domain: %s", field, err)
		}
		if _, dup := norm[domain]; dup {
			return nil, nil, errdefs.InvalidArgument("%s: a rule for %s is already given (domains are case-insensitive; one rule per domain)", field, quote(domain))
		}
		list := rules[key]
		if len(list) > MaxRulesPerDomain {
			return nil, nil, errdefs.InvalidArgument("%s: at most %d rule per domain is allowed, got %d", field, MaxRulesPerDomain, len(list))
		}
		hr := HeaderRule{Domain: domain}
		nlist := make([]Rule, 0, len(list))
		for i, r := range list {
			nr := Rule{}
			if r.Transform != nil {
				headers, err := checkHeaders(field, i, r.Transform.Headers)
				if err != nil {
					return nil, nil, err
				}
				nr.Transform = &Transform{Headers: headers}
				if len(headers) > 0 {
					hr.Headers = maps.Clone(headers)
				}
			}
			nlist = append(nlist, nr)
		}
		norm[domain] = nlist
		out = append(out, hr)
	}
	slices.SortFunc(out, func(a, b HeaderRule) int { return strings.Compare(a.Domain, b.Domain) })
	return norm, out, nil
}

func checkHeaders(field string, i int, headers map[string]string) (map[string]string, error) {
	field = field + "[" + strconv.Itoa(i) + "].transform.headers"
	if len(headers) > MaxHeadersPerRule {
		return nil, errdefs.InvalidArgument("%s: at most %d headers per rule are allowed, got %d", field, MaxHeadersPerRule, len(headers))
	}
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		hf := field + "[" + quote(name) + "]"
		switch {
		case name == "":
			return nil, errdefs.InvalidArgument("%s: a header name must not be empty", hf)
		case len(name) > MaxHeaderNameLen:
			return nil, errdefs.InvalidArgument("%s: a header name must be at most %d characters, got %d", hf, MaxHeaderNameLen, len(name))
		case !isToken(name):
			return nil, errdefs.InvalidArgument("%s: not a valid header name (letters, digits and %s only)", hf, headerTokenSymbols)
		}
		// Header names are case-insensitive on the wire: two spellings would race for one header.
		if prev, dup := seen[strings.ToLower(name)]; dup {
			return nil, errdefs.InvalidArgument("%s: the header is also given as %s (header names are case-insensitive)", hf, quote(prev))
		}
		seen[strings.ToLower(name)] = name
		v := headers[name]
		if len(v) > MaxHeaderValueLen {
			return nil, errdefs.InvalidArgument("%s: a header value must be at most %d characters, got %d", hf, MaxHeaderValueLen, len(v))
		}
		if !validHeaderValue(v) {
			// CR and LF would let a value inject further headers into the request.
			return nil, errdefs.InvalidArgument("%s: a header value must not contain control characters such as CR or LF", hf)
		}
	}
	if headers == nil {
		return nil, nil
	}
	return maps.Clone(headers), nil
}

// isToken reports whether s is an RFC 9110 token, the syntax of a header name.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			strings.IndexByte(headerTokenSymbols, c) >= 0 {
			continue
		}
		return false
	}
	return s != ""
}

// validHeaderValue allows visible characters, spaces, tabs and obs-text (RFC 9110 field-value).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
