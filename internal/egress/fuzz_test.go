package egress

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

// FuzzParse checks that Parse never panics on any input, that every rejection is an
// InvalidArgument, and that an accepted config's normal form is a fixed point meaning the same
// policy, which Decide can judge for any destination.
func FuzzParse(f *testing.F) {
	f.Add("203.0.113.0/24", "0.0.0.0/0", "api.example.com", "Authorization", "Bearer x", "proxy:1080", "fe80::1", false)
	f.Add("*.example.com", "0.0.0.0/0", "*.example.com", "X-A", "v", "[2001:db8::1]:1080", "::ffff:10.0.0.1", true)
	f.Add("::ffff:0:0/96", "::/0", "*", "", "\r\n", ":0", "10.0.0.1", false)
	f.Add("1.2.3.4:80", "0.0.0.0/8", "a..b", "bad header", "x", "host", "", true)
	f.Add("ExAmple.COM.", "2001:db8::1/33", "", "h", "", "a:b:c", "198.51.100.7", false)
	f.Fuzz(func(t *testing.T, allow, deny, ruleDomain, header, value, proxy, dst string, noInternet bool) {
		c := Config{
			AllowOut:    []string{allow},
			DenyOut:     []string{deny},
			Rules:       map[string][]Rule{ruleDomain: {{Transform: &Transform{Headers: map[string]string{header: value}}}}},
			EgressProxy: &ProxyConfig{Address: proxy, Username: header, Password: value},
		}
		if noInternet {
			c.AllowInternetAccess = &noInternet
		}
		p, err := Parse(c)
		if err != nil {
			if errdefs.KindOf(err) != errdefs.KindInvalidArgument {
				t.Fatalf("rejection %v is not InvalidArgument", err)
			}
			return
		}
		n, err := Normalize(c)
		if err != nil {
			t.Fatalf("Parse accepted what Normalize rejects: %v", err)
		}
		n2, err := Normalize(n)
		if err != nil || !reflect.DeepEqual(n, n2) {
			t.Fatalf("normal form is not a fixed point: %+v → %+v, %v", n, n2, err)
		}
		p2, err := Parse(n)
		if err != nil || !reflect.DeepEqual(p, p2) {
			t.Fatalf("normal form means another policy: %+v vs %+v, %v", p, p2, err)
		}
		if a, err := netip.ParseAddr(dst); err == nil {
			Decide(p, NewEnv(nil), TCP, a, 443)
		}
	})
}
