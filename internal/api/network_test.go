package api

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/egress"
)

// egressEnv is an env whose node enforces every egress feature.
func egressEnv(t *testing.T) *env {
	return newEnv(t, envOpts{driver: func(o *driver.Options) {
		o.Features = []string{driver.FeatureNetTap, egress.FeatureDomains, egress.FeatureProxy}
	}})
}

func rulesJSON(n, headers int) string {
	var domains []string
	for i := range n {
		var hs []string
		for j := range headers {
			hs = append(hs, fmt.Sprintf(`"X-H%d":"v"`, j))
		}
		domains = append(domains, fmt.Sprintf(`"api%d.example.com":[{"transform":{"headers":{%s}}}]`, i, strings.Join(hs, ",")))
	}
	return "{" + strings.Join(domains, ",") + "}"
}

// invalidPolicies are egress configs (the body of a network update, and the network object of a
// create once allow_internet_access is moved out) that must be refused with 400 and a message.
var invalidPolicies = []struct {
	name, body, msg string
}{
	{"unspecified /8", `{"denyOut":["192.0.2.1","198.51.100.0/24","0.0.0.0/8"]}`, `network.denyOut[2]: \"0.0.0.0/8\": an unspecified address is only accepted as 0.0.0.0/0`},
	{"::/0", `{"denyOut":["::/0"]}`, `an unspecified address is only accepted as 0.0.0.0/0`},
	{"bare 0.0.0.0 in allowOut", `{"allowOut":["0.0.0.0"]}`, `network.allowOut[0]`},
	{"domain in denyOut", `{"denyOut":["example.com"]}`, "domains are only supported in allowOut"},
	{"garbage", `{"allowOut":["not a host!"]}`, "not a valid IP address, CIDR or domain"},
	{"bad CIDR", `{"denyOut":["203.0.113.0/33"]}`, "not a valid CIDR"},
	{"port", `{"denyOut":["203.0.113.1:443"]}`, "ports are not supported"},
	{"wildcard in the middle", `{"allowOut":["a.*.example.com"],"denyOut":["0.0.0.0/0"]}`, "'*' is only allowed"},
	{"domains without deny-all", `{"allowOut":["example.com"]}`, "require network.denyOut to contain 0.0.0.0/0"},
	{"11 rule domains", `{"rules":` + rulesJSON(11, 1) + `}`, "at most 10 rule domains"},
	{"21 headers", `{"rules":` + rulesJSON(1, 21) + `}`, "at most 20 headers per rule"},
	{"129-character rule domain", `{"rules":{"` + strings.Repeat("a", 63) + "." + strings.Repeat("b", 61) + `.com":[]}}`, "1 to 128 characters long, got 129"},
	{"bare wildcard rule", `{"rules":{"*":[]}}`, "a bare * is not a rule domain"},
	{"two rules for a domain", `{"rules":{"a.example":[{},{}]}}`, "at most 1 rule per domain"},
	{"65-character header name", `{"rules":{"a.example":[{"transform":{"headers":{"` + strings.Repeat("h", 65) + `":"v"}}}]}}`, "at most 64 characters"},
	{"2049-character header value", `{"rules":{"a.example":[{"transform":{"headers":{"A":"` + strings.Repeat("v", 2049) + `"}}}]}}`, "at most 2048 characters"},
	{"CRLF header value", `{"rules":{"a.example":[{"transform":{"headers":{"A":"x\r\nB: y"}}}]}}`, "control characters"},
	{"invalid header name", `{"rules":{"a.example":[{"transform":{"headers":{"bad header":"v"}}}]}}`, "not a valid header name"},
	{"proxy without port", `{"egressProxy":{"address":"proxy.example"}}`, "network.egressProxy.address"},
	{"proxy password without username", `{"egressProxy":{"address":"p:1","password":"x"}}`, "a password requires a username"},
	{"proxy username 256 bytes", `{"egressProxy":{"address":"p:1","username":"` + strings.Repeat("u", 256) + `"}}`, "at most 255 bytes, got 256"},
	{"proxy serverName without tls", `{"egressProxy":{"address":"p:1","tls":{"enabled":false,"serverName":"x.example"}}}`, "requires tls.enabled: true"},
	{"proxy caCert not PEM", `{"egressProxy":{"address":"p:1","tls":{"enabled":true,"caCert":"nope"}}}`, "no PEM certificate found"},
	{"proxy caCert over 8 KiB", `{"egressProxy":{"address":"p:1","tls":{"enabled":true,"caCert":"` + strings.Repeat("x", 8193) + `"}}}`, "at most 8192 bytes"},
	{"allowOut wrong type", `{"allowOut":"203.0.113.1"}`, `expected an array of strings`},
}

func TestCreateInvalidNetwork(t *testing.T) {
	e := egressEnv(t)
	for _, tc := range invalidPolicies {
		t.Run(tc.name, func(t *testing.T) {
			w := e.do("POST", "/v2/sandboxes", `{"templateID":"base","network":`+tc.body+`}`)
			wantError(t, w, http.StatusBadRequest, unescape(t, tc.msg))
		})
	}
	if e.records(t) != 0 || len(e.node.Creates()) != 0 {
		t.Fatal("an invalid network reached the node or left a record")
	}
}

// unescape turns the JSON-escaped quotes some expected messages carry back into plain text.
func unescape(t *testing.T, s string) string {
	t.Helper()
	var out string
	if err := json.Unmarshal([]byte(`"`+s+`"`), &out); err != nil {
		return s
	}
	return out
}

func TestCreateNetworkPlacement(t *testing.T) {
	// A node without egress features: domains, rules and a proxy need a compatible node.
	e := newEnv(t, envOpts{})
	for _, body := range []string{
		`{"templateID":"base","network":{"allowOut":["pypi.org","*.pythonhosted.org"],"denyOut":["0.0.0.0/0"]}}`,
		`{"templateID":"base","allow_internet_access":false,"network":{"allowOut":["pypi.org"]}}`,
		`{"templateID":"base","network":{"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer t"}}}]}}}`,
		`{"templateID":"base","network":{"egressProxy":{"address":"proxy.example.com:1080","username":"u","password":"p"}}}`,
	} {
		w := e.do("POST", "/v2/sandboxes", body)
		wantError(t, w, http.StatusServiceUnavailable, "no node can enforce this network policy")
		if got := decode(t, w)["error_code"]; got != "sandbox_no_compatible_node" {
			t.Fatalf("%s: error_code %v", body, got)
		}
	}
	// A CIDR policy needs nothing beyond networking.
	e.create(t, `{"templateID":"base","network":{"allowOut":["203.0.113.0/24"],"denyOut":["0.0.0.0/0"]}}`)

	// A node that cannot network sandboxes at all refuses every create.
	bare := newEnv(t, envOpts{driver: func(o *driver.Options) { o.Features = nil }})
	w := bare.do("POST", "/v2/sandboxes", `{"templateID":"base"}`)
	wantError(t, w, http.StatusServiceUnavailable, "no CAP_NET_ADMIN: this node cannot network sandboxes and will reject creates")
	if got := decode(t, w)["error_code"]; got != "sandbox_no_compatible_node" {
		t.Fatalf("error_code %v", got)
	}
}

func TestCreateGetNormalizedNetwork(t *testing.T) {
	e := egressEnv(t)
	sb := e.create(t, `{"templateID":"base","allow_internet_access":true,"network":{
		"allowPublicTraffic":false,"maskRequestHost":"${PORT}.custom.example","httpsPorts":[8443],
		"allowOut":[" PyPI.org ","*.PythonHosted.org","203.0.113.77/24","::ffff:198.51.100.7","2001:DB8::1"],
		"denyOut":["0.0.0.0/0","192.0.2.1"],
		"rules":{"API.example.com":[{"transform":{"headers":{"Authorization":"Bearer t"}}}]},
		"egressProxy":{"address":"Proxy.Example.com:1080","username":"u","password":"hunter2",
			"tls":{"enabled":true,"serverName":"Cert.Example","caCert":"`+strings.ReplaceAll(testCA(t), "\n", `\n`)+`"}}}}`)
	id := sb["sandboxID"].(string)

	w := e.do("GET", "/sandboxes/"+id, "")
	if w.Code != http.StatusOK {
		t.Fatalf("get: %d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), "hunter2") || strings.Contains(w.Body.String(), "BEGIN CERTIFICATE") {
		t.Fatalf("detail leaks the proxy password or CA: %s", w.Body)
	}
	var d struct {
		AllowInternetAccess *bool          `json:"allowInternetAccess"`
		Network             map[string]any `json:"network"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"allowPublicTraffic": false,
		"maskRequestHost":    "${PORT}.custom.example",
		"httpsPorts":         []any{8443.0},
		"allowOut":           []any{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24", "198.51.100.7/32", "2001:db8::1/128"},
		"denyOut":            []any{"0.0.0.0/0", "192.0.2.1/32"},
		"rules": map[string]any{"api.example.com": []any{map[string]any{"transform": map[string]any{
			"headers": map[string]any{"Authorization": "Bearer t"}}}}},
		"egressProxy": map[string]any{"address": "proxy.example.com:1080", "username": "u",
			"tls": map[string]any{"enabled": true, "serverName": "cert.example"}},
	}
	if !reflect.DeepEqual(d.Network, want) || d.AllowInternetAccess == nil || !*d.AllowInternetAccess {
		t.Fatalf("network = %#v\nallowInternetAccess %v", d.Network, d.AllowInternetAccess)
	}

	// The node enforces the same policy the record shows.
	spec, _ := e.node.Spec(id)
	if len(spec.Egress.AllowDomains) != 2 || spec.Egress.Proxy == nil || spec.Egress.Proxy.Password != "hunter2" {
		t.Fatalf("node policy %+v", spec.Egress)
	}
}

func TestUpdateNetwork(t *testing.T) {
	e := egressEnv(t)
	sb := e.create(t, `{"templateID":"base","allow_internet_access":false,"network":{
		"allowPublicTraffic":false,"maskRequestHost":"${PORT}.custom.example","httpsPorts":[8443],
		"allowOut":["203.0.113.0/24"],"denyOut":["0.0.0.0/0"],
		"rules":{"api.example.com":[]},"egressProxy":{"address":"p:1080"}}}`)
	id := sb["sandboxID"].(string)
	path := "/sandboxes/" + id + "/network"

	// 204 with no body; full replacement that keeps the ingress settings.
	w := e.do("PUT", path, `{"allowOut":["GitHub.com"],"denyOut":["0.0.0.0/0"],"allow_internet_access":true}`)
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Fatalf("update: %d %q", w.Code, w.Body)
	}
	d := decode(t, e.do("GET", "/sandboxes/"+id, ""))
	net := d["network"].(map[string]any)
	want := map[string]any{"allowPublicTraffic": false, "maskRequestHost": "${PORT}.custom.example",
		"httpsPorts": []any{8443.0}, "allowOut": []any{"github.com"}, "denyOut": []any{"0.0.0.0/0"}}
	if !reflect.DeepEqual(net, want) || d["allowInternetAccess"] != true {
		t.Fatalf("after update: network %#v, allowInternetAccess %v", net, d["allowInternetAccess"])
	}
	spec, _ := e.node.Spec(id)
	if !reflect.DeepEqual(spec.Egress.AllowDomains, []string{"github.com"}) || spec.Egress.Proxy != nil || spec.Egress.Rules != nil {
		t.Fatalf("node policy %+v", spec.Egress)
	}
	ups := e.node.Updates()
	if len(ups) != 1 || ups[0].ID != id || !reflect.DeepEqual(ups[0].Policy, spec.Egress) {
		t.Fatalf("node updates %+v", ups)
	}

	// Omitted fields are cleared, allow_internet_access included.
	if w := e.do("PUT", path, `{}`); w.Code != http.StatusNoContent {
		t.Fatalf("clear: %d %s", w.Code, w.Body)
	}
	d = decode(t, e.do("GET", "/sandboxes/"+id, ""))
	if net := d["network"].(map[string]any); net["allowOut"] != nil || net["denyOut"] != nil ||
		net["maskRequestHost"] != "${PORT}.custom.example" || d["allowInternetAccess"] != nil {
		t.Fatalf("after clearing: %v", d)
	}

	// Every invalid policy is a 400 with a message, and changes nothing.
	before := e.do("GET", "/sandboxes/"+id, "").Body.String()
	for _, tc := range invalidPolicies {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("PUT", path, tc.body), http.StatusBadRequest, unescape(t, tc.msg))
		})
	}
	wantError(t, e.do("PUT", path, ""), http.StatusBadRequest, "request body is required")
	wantError(t, e.do("PUT", path, `{"allow_internet_access":"no"}`), http.StatusBadRequest, `"allow_internet_access": expected a boolean`)
	if after := e.do("GET", "/sandboxes/"+id, "").Body.String(); after != before {
		t.Fatalf("a refused update changed the sandbox:\n%s\n%s", before, after)
	}
	if len(e.node.Updates()) != 2 {
		t.Fatalf("refused updates reached the node: %d updates", len(e.node.Updates()))
	}

	// Unknown: 404 with JSON code 404 (the SDK's SandboxNotFoundError); killed: 409.
	wantError(t, e.do("PUT", "/sandboxes/nosuchsandbox0000000/network", `{}`), http.StatusNotFound, "not found")
	if w := e.do("DELETE", "/sandboxes/"+id, ""); w.Code != http.StatusNoContent {
		t.Fatalf("kill: %d", w.Code)
	}
	wantError(t, e.do("PUT", path, `{"denyOut":["0.0.0.0/0"]}`), http.StatusConflict, "only a running sandbox")
}

func TestUpdateNetworkNeedsNodeFeatures(t *testing.T) {
	e := newEnv(t, envOpts{})
	id := e.create(t, `{"templateID":"base"}`)["sandboxID"].(string)
	for _, body := range []string{
		`{"allowOut":["github.com"],"denyOut":["0.0.0.0/0"]}`,
		`{"rules":{"api.example.com":[]}}`,
		`{"egressProxy":{"address":"p:1080"}}`,
	} {
		wantError(t, e.do("PUT", "/sandboxes/"+id+"/network", body), http.StatusBadRequest,
			"the sandbox's node cannot enforce this network policy")
	}
	// A CIDR-only update needs nothing more.
	if w := e.do("PUT", "/sandboxes/"+id+"/network", `{"denyOut":["198.51.100.0/24"]}`); w.Code != http.StatusNoContent {
		t.Fatalf("CIDR update: %d %s", w.Code, w.Body)
	}
}

// testCA returns a freshly generated self-signed CA certificate in PEM.
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
