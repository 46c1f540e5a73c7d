package egress

import (
	"reflect"
	"testing"
)

// The reference for name-aware backends: Judge, then DialTargets over the test zone for domain
// flows, reaches every NameTable expectation.
func TestNameTable(t *testing.T) {
	zone := TestZone()
	seen := map[string]bool{}
	for _, tc := range NameTable() {
		t.Run(tc.Name, func(t *testing.T) {
			if seen[tc.Name] {
				t.Fatal("duplicate case name")
			}
			seen[tc.Name] = true
			if p, err := Parse(tc.Config); err != nil || !reflect.DeepEqual(p, tc.Policy) {
				t.Fatalf("Policy is not Parse(Config): %v", err)
			}
			d := Judge(tc.Policy, tc.Env, TCP, tc.Dst, tc.Port, tc.Host)
			dial := tc.Dst
			if d.Verdict == Allow && d.Stage == StageDomain {
				host, _ := HostName(tc.Host)
				targets := tc.Env.DialTargets(zone[host])
				if len(targets) == 0 {
					d = Decision{Verdict: Deny, Stage: StageAlwaysDenied}
				} else {
					dial = targets[0]
				}
			}
			if d.Verdict != tc.Want || d.Stage != tc.Stage {
				t.Fatalf("got %s at %s (%s), want %s at %s", d.Verdict, d.Stage, d.Rule, tc.Want, tc.Stage)
			}
			if tc.Want == Allow && dial != tc.Dial {
				t.Fatalf("dials %s, want %s", dial, tc.Dial)
			}
		})
	}
}

func TestHostName(t *testing.T) {
	for in, want := range map[string]string{
		"a.test": "a.test", "A.TEST.": "a.test", "a.test:8080": "a.test", "x_y.a.test": "x_y.a.test",
		"": "", "203.0.113.10": "", "203.0.113.10:80": "", "[2001:db8::1]": "", "[2001:db8::1]:80": "",
		"2001:db8::1": "", "a..test": "", "-a.test": "", "a.test:": "a.test", "*.a.test": "", "a test": "",
		"10.0.0": "",
	} {
		got, ok := HostName(in)
		if got != want || ok != (want != "") {
			t.Errorf("HostName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// Judge is Decide for flows without a name, over the whole address table.
func TestJudgeAgreesWithDecide(t *testing.T) {
	for _, tc := range DecisionTable() {
		if got := Judge(tc.Policy, tc.Env, tc.Proto, tc.Dst, tc.Port, ""); got.Verdict != tc.Want {
			t.Errorf("%s: Judge = %s at %s, want %s", tc.Name, got.Verdict, got.Stage, tc.Want)
		}
	}
	// A name on another port or protocol changes nothing.
	p, _ := Parse(Config{AllowOut: []string{"*"}, DenyOut: []string{AllTraffic}})
	for _, c := range []struct {
		proto Proto
		port  uint16
	}{{TCP, 8080}, {UDP, 443}, {UDP, 80}, {ICMP, 0}, {TCP, 22}} {
		if d := Judge(p, NewEnv(nil), c.proto, TestZone()["a.test"][0], c.port, "a.test"); d.Verdict != Deny {
			t.Errorf("%s/%d with a name: %s at %s", c.proto, c.port, d.Verdict, d.Stage)
		}
	}
}

func TestMatchRule(t *testing.T) {
	p := Policy{Rules: []HeaderRule{
		{Domain: "*.example.com", Headers: map[string]string{"A": "wild"}},
		{Domain: "*.api.example.com", Headers: map[string]string{"A": "deeper"}},
		{Domain: "api.example.com", Headers: map[string]string{"A": "exact"}},
		{Domain: "empty.example.com"},
	}}
	for host, want := range map[string]string{
		"api.example.com":      "api.example.com",
		"v1.api.example.com":   "*.api.example.com",
		"x.v1.api.example.com": "*.api.example.com",
		"www.example.com":      "*.example.com",
		"empty.example.com":    "empty.example.com",
		"example.com":          "",
		"example.org":          "",
	} {
		r, ok := p.MatchRule(host)
		if ok != (want != "") || r.Domain != want {
			t.Errorf("MatchRule(%q) = %q, %v; want %q", host, r.Domain, ok, want)
		}
	}
}
