package driver

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

var allFeatures = []string{FeatureNetTap, egress.FeatureDomains, egress.FeatureProxy}

func mustPolicy(t *testing.T, c egress.Config) egress.Policy {
	t.Helper()
	p, err := egress.Parse(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func storedNetwork(t *testing.T, e *env, id string) (Network, store.Sandbox) {
	t.Helper()
	sb, err := e.store.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	n, err := decodeNetwork(sb.Network)
	if err != nil {
		t.Fatal(err)
	}
	return n, sb
}

func TestCreateNetworkInvalid(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Features = allFeatures })
	f := false
	for _, tc := range []struct {
		name     string
		network  *Network
		internet *bool
		msg      string
	}{
		{"unspecified in denyOut", &Network{DenyOut: []string{"0.0.0.0/8"}}, nil,
			`network.denyOut[0]: "0.0.0.0/8": an unspecified address is only accepted as 0.0.0.0/0`},
		{"::/0", &Network{DenyOut: []string{"192.0.2.1", "::/0"}}, nil, "network.denyOut[1]"},
		{"domain in denyOut", &Network{DenyOut: []string{"example.com"}}, nil, "domains are only supported in allowOut"},
		{"domain without deny-all", &Network{AllowOut: []string{"example.com"}}, nil, "require network.denyOut to contain 0.0.0.0/0"},
		{"domain with allow_internet_access true", &Network{AllowOut: []string{"example.com"}}, boolPtr(true), "require network.denyOut"},
		{"bad CIDR", &Network{AllowOut: []string{"203.0.113.0/33"}}, nil, "not a valid CIDR"},
		{"rule bare wildcard", &Network{Rules: map[string][]NetworkRule{"*": nil}}, nil, "a bare * is not a rule domain"},
		{"proxy password alone", &Network{EgressProxy: &EgressProxy{Address: "p:1", Password: "x"}}, nil, "a password requires a username"},
		{"proxy tls server name without tls", &Network{EgressProxy: &EgressProxy{Address: "p:1", TLS: &EgressProxyTLS{ServerName: "a.example"}}}, nil, "requires tls.enabled"},
		{"https port after valid egress", &Network{AllowOut: []string{"203.0.113.0/24"}, HTTPSPorts: []int{70000}}, &f, "httpsPorts[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.d.Create(context.Background(), CreateRequest{Template: "base", Network: tc.network, AllowInternetAccess: tc.internet})
			wantKind(t, err, errdefs.KindInvalidArgument)
			if !strings.Contains(errdefs.PublicMessage(err), tc.msg) {
				t.Fatalf("message %q does not contain %q", errdefs.PublicMessage(err), tc.msg)
			}
		})
	}
	if len(e.node.Creates()) != 0 || e.countRecords(t) != 0 {
		t.Fatal("an invalid network reached the node or left a record")
	}
}

func boolPtr(b bool) *bool { return &b }

func TestCreatePassesPolicyAndStoresNormalForm(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Features = allFeatures })
	f := false
	in := &Network{
		AllowPublicTraffic: &f,
		AllowOut:           []string{"PyPI.org", "203.0.113.9/24", "::ffff:198.51.100.7"},
		DenyOut:            []string{egress.AllTraffic, "192.0.2.1"},
		Rules: map[string][]NetworkRule{"API.example.com": {{Transform: &NetworkTransform{
			Headers: map[string]string{"Authorization": "Bearer t"}}}}},
		EgressProxy: &EgressProxy{Address: "Proxy.Example:1080", Username: "u", Password: "secret"},
		HTTPSPorts:  []int{8443},
	}
	sb := e.create(t, CreateRequest{Network: in})

	want := mustPolicy(t, egress.Config{AllowOut: in.AllowOut, DenyOut: in.DenyOut, Rules: in.Rules, EgressProxy: in.EgressProxy})
	spec, _ := e.node.Spec(sb.ID)
	if !reflect.DeepEqual(spec.Egress, want) {
		t.Fatalf("node got policy %+v, want %+v", spec.Egress, want)
	}
	if !reflect.DeepEqual(e.node.Creates()[0].Egress, want) {
		t.Fatal("create spec lacks the policy")
	}

	n, rec := storedNetwork(t, e, sb.ID)
	if !reflect.DeepEqual(n.AllowOut, []string{"pypi.org", "203.0.113.0/24", "198.51.100.7/32"}) ||
		!reflect.DeepEqual(n.DenyOut, []string{egress.AllTraffic, "192.0.2.1/32"}) ||
		n.Rules["api.example.com"] == nil || n.EgressProxy.Address != "proxy.example:1080" ||
		n.EgressProxy.Password != "secret" || !reflect.DeepEqual(n.HTTPSPorts, []int{8443}) || *n.AllowPublicTraffic {
		t.Fatalf("stored network %+v", n)
	}
	// The stored normal form means the same policy after a restart.
	if p, err := policyOf(rec); err != nil || !reflect.DeepEqual(p, want) {
		t.Fatalf("policyOf = %+v, %v", p, err)
	}
	// Clients read it back without secrets.
	pub, err := NetworkOf(rec)
	if err != nil || pub.EgressProxy.Password != "" || pub.EgressProxy.Username != "u" || *pub.AllowPublicTraffic {
		t.Fatalf("NetworkOf = %+v, %v", pub, err)
	}

	// allow_internet_access alone: deny-all policy, no network stored.
	sb2 := e.create(t, CreateRequest{AllowInternetAccess: &f})
	spec2, _ := e.node.Spec(sb2.ID)
	if !reflect.DeepEqual(spec2.Egress, mustPolicy(t, egress.Config{DenyOut: []string{egress.AllTraffic}})) {
		t.Fatalf("allow_internet_access:false policy %+v", spec2.Egress)
	}
	if _, rec2 := storedNetwork(t, e, sb2.ID); *rec2.AllowInternetAccess {
		t.Fatal("allow_internet_access not recorded")
	}
	// No network at all: the empty (allow-all) policy.
	sb3 := e.create(t, CreateRequest{})
	if spec3, _ := e.node.Spec(sb3.ID); !reflect.DeepEqual(spec3.Egress, egress.Policy{}) {
		t.Fatalf("default policy %+v", spec3.Egress)
	}
}

func TestCreatePlacement(t *testing.T) {
	domains := &Network{AllowOut: []string{"example.com"}, DenyOut: []string{egress.AllTraffic}}
	rules := &Network{Rules: map[string][]NetworkRule{"api.example.com": nil}}
	proxy := &Network{EgressProxy: &EgressProxy{Address: "p:1080"}}
	cidrs := &Network{AllowOut: []string{"203.0.113.0/24"}, DenyOut: []string{egress.AllTraffic}}
	for _, tc := range []struct {
		name     string
		features []string
		network  *Network
		msg      string // "" means the create succeeds
	}{
		{"no features at all", nil, nil, "no CAP_NET_ADMIN: this node cannot network sandboxes and will reject creates"},
		{"egress features without networking", []string{egress.FeatureDomains, egress.FeatureProxy}, cidrs, "no CAP_NET_ADMIN"},
		{"plain networking", []string{FeatureNetTap}, cidrs, ""},
		{"user networking", []string{FeatureNetUser}, nil, ""},
		{"domains need egress-domains", []string{FeatureNetTap, egress.FeatureProxy}, domains,
			"domain entries in network.allowOut need the egress-domains feature (node features: net-tap, egress-proxy)"},
		{"rules need egress-proxy", []string{FeatureNetTap, egress.FeatureDomains}, rules, "need the egress-proxy feature"},
		{"proxy needs egress-proxy", []string{FeatureNetTap}, proxy, "need the egress-proxy feature"},
		{"domains with the feature", []string{FeatureNetTap, egress.FeatureDomains}, domains, ""},
		{"proxy with the feature", []string{FeatureNetUser, egress.FeatureProxy}, proxy, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.Features = tc.features })
			_, err := e.d.Create(context.Background(), CreateRequest{Template: "base", Network: tc.network})
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantKind(t, err, errdefs.KindUnavailable)
			if errdefs.CodeOf(err) != NoCompatibleNodeErrorCode || !strings.Contains(errdefs.PublicMessage(err), tc.msg) {
				t.Fatalf("error %q code %q, want %q", errdefs.PublicMessage(err), errdefs.CodeOf(err), tc.msg)
			}
			if len(e.node.Creates()) != 0 || e.countRecords(t) != 0 {
				t.Fatal("a refused create reached the node or left a record")
			}
		})
	}
}

func TestUpdateNetwork(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Features = allFeatures })
	ctx := context.Background()
	f := false
	mask := "${PORT}-custom.example"
	sb := e.create(t, CreateRequest{Network: &Network{
		AllowPublicTraffic: &f, MaskRequestHost: &mask, HTTPSPorts: []int{8443},
		AllowOut: []string{"203.0.113.0/24"}, DenyOut: []string{egress.AllTraffic},
		Rules:       map[string][]NetworkRule{"api.example.com": nil},
		EgressProxy: &EgressProxy{Address: "p:1080", Username: "u", Password: "pw"},
	}, AllowInternetAccess: &f})

	// Full replacement: omitted fields are cleared, ingress settings kept.
	upd := NetworkUpdate{AllowOut: []string{"GitHub.com"}, DenyOut: []string{egress.AllTraffic, "198.51.100.7"}}
	if err := e.d.UpdateNetwork(ctx, sb.ID, upd); err != nil {
		t.Fatal(err)
	}
	want := mustPolicy(t, upd)
	if spec, _ := e.node.Spec(sb.ID); !reflect.DeepEqual(spec.Egress, want) {
		t.Fatalf("node policy %+v, want %+v", spec.Egress, want)
	}
	n, rec := storedNetwork(t, e, sb.ID)
	if !reflect.DeepEqual(n.AllowOut, []string{"github.com"}) || !reflect.DeepEqual(n.DenyOut, []string{egress.AllTraffic, "198.51.100.7/32"}) ||
		n.Rules != nil || n.EgressProxy != nil || rec.AllowInternetAccess != nil {
		t.Fatalf("record after update: %+v, allow_internet_access %v", n, rec.AllowInternetAccess)
	}
	if *n.AllowPublicTraffic || *n.MaskRequestHost != mask || !reflect.DeepEqual(n.HTTPSPorts, []int{8443}) ||
		rec.TrafficAccessToken == "" || rec.AllowPublicTraffic {
		t.Fatalf("ingress settings lost: %+v", n)
	}
	if p, err := policyOf(rec); err != nil || !reflect.DeepEqual(p, want) {
		t.Fatalf("record means %+v, %v", p, err)
	}

	// allow_internet_access is replaced too; an empty update clears everything.
	if err := e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{AllowInternetAccess: &f}); err != nil {
		t.Fatal(err)
	}
	if _, rec := storedNetwork(t, e, sb.ID); rec.AllowInternetAccess == nil || *rec.AllowInternetAccess {
		t.Fatal("allow_internet_access not recorded")
	}
	if spec, _ := e.node.Spec(sb.ID); !reflect.DeepEqual(spec.Egress, mustPolicy(t, egress.Config{DenyOut: []string{egress.AllTraffic}})) {
		t.Fatalf("node policy %+v", spec.Egress)
	}
	if err := e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{}); err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.node.Spec(sb.ID); !reflect.DeepEqual(spec.Egress, egress.Policy{}) {
		t.Fatalf("node policy after clearing %+v", spec.Egress)
	}
	if n, rec := storedNetwork(t, e, sb.ID); n.AllowOut != nil || n.DenyOut != nil || rec.AllowInternetAccess != nil || *n.MaskRequestHost != mask {
		t.Fatalf("record after clearing %+v", n)
	}
	if got := len(e.node.Updates()); got != 3 {
		t.Fatalf("%d node updates, want 3", got)
	}
}

func TestUpdateNetworkRefusals(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Features = []string{FeatureNetTap} })
	ctx := context.Background()
	sb := e.create(t, CreateRequest{Network: &Network{DenyOut: []string{"192.0.2.0/24"}}})
	killed := e.create(t, CreateRequest{})
	if err := e.d.Kill(ctx, killed.ID); err != nil {
		t.Fatal(err)
	}
	before, _ := storedNetwork(t, e, sb.ID)

	for _, tc := range []struct {
		name string
		id   string
		upd  NetworkUpdate
		kind errdefs.Kind
		msg  string
	}{
		{"unknown", "nosuchsandbox0000000", NetworkUpdate{}, errdefs.KindNotFound, "not found"},
		{"killed", killed.ID, NetworkUpdate{}, errdefs.KindConflict, "is killed; only a running sandbox"},
		{"invalid entry", sb.ID, NetworkUpdate{DenyOut: []string{"0.0.0.0"}}, errdefs.KindInvalidArgument, `network.denyOut[0]: "0.0.0.0"`},
		{"invalid on unknown id is still 400", "nosuchsandbox0000000", NetworkUpdate{DenyOut: []string{"x"}}, errdefs.KindInvalidArgument, "network.denyOut[0]"},
		{"domains without the feature", sb.ID, NetworkUpdate{AllowOut: []string{"example.com"}, DenyOut: []string{egress.AllTraffic}},
			errdefs.KindInvalidArgument, "the sandbox's node cannot enforce this network policy: domain entries in network.allowOut need the egress-domains feature"},
		{"proxy without the feature", sb.ID, NetworkUpdate{EgressProxy: &EgressProxy{Address: "p:1"}}, errdefs.KindInvalidArgument, "egress-proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.d.UpdateNetwork(ctx, tc.id, tc.upd)
			wantKind(t, err, tc.kind)
			if !strings.Contains(errdefs.PublicMessage(err), tc.msg) {
				t.Fatalf("message %q does not contain %q", errdefs.PublicMessage(err), tc.msg)
			}
		})
	}
	if len(e.node.Updates()) != 0 {
		t.Fatalf("refused updates reached the node: %+v", e.node.Updates())
	}
	if after, _ := storedNetwork(t, e, sb.ID); !reflect.DeepEqual(after, before) {
		t.Fatalf("record changed: %+v", after)
	}
}

func TestUpdateNetworkNodeFailureKeepsRecord(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{Network: &Network{DenyOut: []string{"192.0.2.0/24"}}})
	before, rec := storedNetwork(t, e, sb.ID)
	orig, _ := e.node.Spec(sb.ID)

	e.node.Set(func(n *drivertest.Node) {
		n.UpdateErr = errors.New("iptables-restore: exit status 1 at /run/xtables.lock")
	})
	err := e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{DenyOut: []string{egress.AllTraffic}})
	wantKind(t, err, errdefs.KindUnknown)
	if strings.Contains(errdefs.PublicMessage(err), "/run") {
		t.Fatalf("public message leaks a host path: %q", errdefs.PublicMessage(err))
	}
	after, rec2 := storedNetwork(t, e, sb.ID)
	if !reflect.DeepEqual(after, before) || !reflect.DeepEqual(rec2.AllowInternetAccess, rec.AllowInternetAccess) {
		t.Fatalf("record changed after a failed node update: %+v", after)
	}
	if spec, _ := e.node.Spec(sb.ID); !reflect.DeepEqual(spec.Egress, orig.Egress) {
		t.Fatal("fake node changed its policy on failure")
	}

	// A kinded node error passes through; a node that lost the sandbox means NotFound.
	e.node.Set(func(n *drivertest.Node) { n.UpdateErr = errdefs.Unavailable("node busy") })
	wantKind(t, e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{}), errdefs.KindUnavailable)
	e.node.Set(func(n *drivertest.Node) { n.UpdateErr = nil })
	e.node.Forget(sb.ID)
	wantKind(t, e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{}), errdefs.KindNotFound)
}

func TestUpdateNetworkStoreFailureRollsBackNode(t *testing.T) {
	ns := &drivertest.NetworkStore{}
	e := newEnv(t, func(o *Options) { o.NetworkStore = ns })
	ns.Store = e.store
	ctx := context.Background()
	orig := &Network{AllowOut: []string{"203.0.113.0/24"}, DenyOut: []string{egress.AllTraffic}}
	sb := e.create(t, CreateRequest{Network: orig})
	origPolicy := mustPolicy(t, egress.Config{AllowOut: orig.AllowOut, DenyOut: orig.DenyOut})

	ns.Err = errors.New("database is locked")
	if err := e.d.UpdateNetwork(ctx, sb.ID, NetworkUpdate{}); err == nil {
		t.Fatal("update succeeded without being recorded")
	}
	ups := e.node.Updates()
	if len(ups) != 2 || !reflect.DeepEqual(ups[0].Policy, egress.Policy{}) || !reflect.DeepEqual(ups[1].Policy, origPolicy) {
		t.Fatalf("node updates %+v, want the new policy then the original back", ups)
	}
	if spec, _ := e.node.Spec(sb.ID); !reflect.DeepEqual(spec.Egress, origPolicy) {
		t.Fatalf("node left on %+v", spec.Egress)
	}
}

func TestUpdateNetworkRecordsInStore(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.NetworkStore = nil })
	sb := e.create(t, CreateRequest{})
	no := false
	if err := e.d.UpdateNetwork(context.Background(), sb.ID, NetworkUpdate{AllowInternetAccess: &no}); err != nil {
		t.Fatal(err)
	}
	got, err := e.store.GetSandbox(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.AllowInternetAccess == nil || *got.AllowInternetAccess {
		t.Fatalf("record not updated: allow_internet_access %v, network %s", got.AllowInternetAccess, got.Network)
	}
	if len(e.node.Updates()) != 1 {
		t.Fatalf("node updates %+v, want one", e.node.Updates())
	}
}

func TestNetworkOfRedacts(t *testing.T) {
	raw, _ := json.Marshal(Network{EgressProxy: &EgressProxy{Address: "p:1", Username: "u", Password: "pw",
		TLS: &EgressProxyTLS{Enabled: true, ServerName: "s.example", CACert: "PEM"}}})
	n, err := NetworkOf(Sandbox{Network: raw, AllowPublicTraffic: true})
	if err != nil {
		t.Fatal(err)
	}
	if n.EgressProxy.Password != "" || n.EgressProxy.TLS.CACert != "" || n.EgressProxy.TLS.ServerName != "s.example" ||
		!*n.AllowPublicTraffic {
		t.Fatalf("NetworkOf = %+v %+v", n.EgressProxy, n.EgressProxy.TLS)
	}
	if _, err := NetworkOf(Sandbox{Network: json.RawMessage("{")}); errdefs.KindOf(err) != errdefs.KindUnknown || err == nil {
		t.Fatalf("corrupt record: %v", err)
	}
}
