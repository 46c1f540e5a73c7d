package api

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
)

var sandboxIDRE = regexp.MustCompile(`^[a-z0-9]{20}$`)

func TestCreateValidation(t *testing.T) {
	e := newEnv(t, envOpts{driver: func(o *driver.Options) { o.MaxTimeout = 24 * time.Hour }})
	for _, tc := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"empty body", "", 400, "request body is required"},
		{"whitespace body", "  \n", 400, "request body is required"},
		{"truncated JSON", `{"templateID":`, 400, "malformed JSON"},
		{"syntax error", `{"templateID" "base"}`, 400, "malformed JSON at byte"},
		{"trailing data", `{"templateID":"base"} {}`, 400, "unexpected data after the JSON object"},
		{"array body", `[]`, 400, "must be a JSON object, got array"},
		{"string body", `"base"`, 400, "must be a JSON object, got string"},
		{"null body", `null`, 400, "templateID is required"},
		{"missing templateID", `{}`, 400, "templateID is required"},
		{"empty templateID", `{"templateID":""}`, 400, "templateID is required"},
		{"templateID number", `{"templateID":1}`, 400, `invalid value for "templateID": expected a string, got number`},
		{"timeout string", `{"templateID":"base","timeout":"10"}`, 400, `"timeout": expected an integer, got string`},
		{"timeout float", `{"templateID":"base","timeout":1.5}`, 400, `"timeout": expected an integer, got number 1.5`},
		{"timeout huge", `{"templateID":"base","timeout":1e30}`, 400, `"timeout": expected an integer`},
		{"timeout negative", `{"templateID":"base","timeout":-1}`, 400, "timeout must not be negative"},
		{"timeout above max", `{"templateID":"base","timeout":86401}`, 400, "timeout of 86401s exceeds the maximum of 86400s"},
		{"timeout int64 max", `{"templateID":"base","timeout":9223372036854775807}`, 400, "exceeds the maximum"},
		{"metadata array", `{"templateID":"base","metadata":[]}`, 400, `"metadata": expected an object of strings, got array`},
		{"metadata value number", `{"templateID":"base","metadata":{"a":1}}`, 400, `invalid value for "metadata": expected a string, got number`},
		{"metadata empty key", `{"templateID":"base","metadata":{"":"x"}}`, 400, "metadata: keys must not be empty"},
		{"envVars value bool", `{"templateID":"base","envVars":{"A":true}}`, 400, `invalid value for "envVars": expected a string, got bool`},
		{"envVars bad name", `{"templateID":"base","envVars":{"A=B":"x"}}`, 400, "invalid variable name"},
		{"allow_internet_access string", `{"templateID":"base","allow_internet_access":"yes"}`, 400, `"allow_internet_access": expected a boolean`},
		{"secure string", `{"templateID":"base","secure":"no"}`, 400, `"secure": expected a boolean`},
		{"autoPause string", `{"templateID":"base","autoPause":1}`, 400, `"autoPause": expected a boolean`},
		{"network not object", `{"templateID":"base","network":true}`, 400, `"network": expected an object`},
		{"allowOut string", `{"templateID":"base","network":{"allowOut":"1.1.1.1"}}`, 400, `"network.allowOut": expected an array of strings`},
		{"allowOut bad entry", `{"templateID":"base","network":{"allowOut":["not valid!"]}}`, 400, "network.allowOut[0]"},
		{"denyOut domain", `{"templateID":"base","network":{"denyOut":["example.com"]}}`, 400, "network.denyOut[0]"},
		{"allowPublicTraffic string", `{"templateID":"base","network":{"allowPublicTraffic":"false"}}`, 400, `"network.allowPublicTraffic": expected a boolean`},
		{"httpsPorts bad", `{"templateID":"base","network":{"httpsPorts":[70000]}}`, 400, "httpsPorts"},
		{"volumeMounts wrong type", `{"templateID":"base","volumeMounts":{}}`, 400, `"volumeMounts": expected an array`},
		{"unknown template", `{"templateID":"nope"}`, 404, `template "nope" not found`},
		{"template not ready", `{"templateID":"wip"}`, 404, "not ready"},
		// The fake node cannot pause: lifecycle options that need it are refused, not ignored.
		{"auto pause", `{"templateID":"base","autoPause":true}`, 501, "not supported yet"},
		{"auto resume", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`, 501, "not supported yet"},
		{"auto resume of a files-only pause", `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "filesystem-only pause"},
		{"volume mounts", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`, 501, "volumes on this node are not supported yet"},
		{"too large", `{"templateID":"base","metadata":{"x":"` + strings.Repeat("a", 1<<20) + `"}}`, 413, "exceeds the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", "/v2/sandboxes", tc.body), tc.status, tc.msg)
		})
	}
	if n := e.records(t); n != 0 {
		t.Fatalf("%d records left by rejected creates", n)
	}
	if len(e.node.Creates()) != 0 {
		t.Fatal("the node was asked to boot a rejected sandbox")
	}
	// Unknown fields are ignored, and so are options that are client-side only.
	e.create(t, `{"templateID":"base","futureField":{"x":1},"mcp":{"a":{}},"autoResume":{"enabled":false},"iam":{}}`)
}

func TestCreateResponse(t *testing.T) {
	e := newEnv(t, envOpts{})
	w := e.do("POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"sandboxTestId":"t1"},"envVars":{"FOO":"bar"}}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	// null (not absent) for these two: the SDK's types expect them.
	if string(raw["trafficAccessToken"]) != "null" || string(raw["domain"]) != "null" {
		t.Fatalf("trafficAccessToken/domain not null: %s", w.Body)
	}
	got := decode(t, w)
	if !sandboxIDRE.MatchString(got["sandboxID"].(string)) || got["clientID"] != ClientID ||
		got["templateID"] != baseID || got["alias"] != "base" || got["envdVersion"] != "0.6.13" ||
		len(got["envdAccessToken"].(string)) != 32 {
		t.Fatalf("response = %v", got)
	}
	spec, ok := e.node.Spec(got["sandboxID"].(string))
	if !ok || spec.EnvVars["FOO"] != "bar" || spec.AccessToken != got["envdAccessToken"] {
		t.Fatalf("node spec = %+v", spec)
	}

	// Private traffic: a traffic token; v1 with secure:false: no envd token; domain when configured.
	e2 := newEnv(t, envOpts{api: func(o *Options) { o.Domain = "vmon.example" }})
	got = e2.create(t, `{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	if tok, _ := got["trafficAccessToken"].(string); len(tok) != 32 || got["domain"] != "vmon.example" {
		t.Fatalf("private response = %v", got)
	}
	w = e2.do("POST", "/sandboxes", `{"templateID":"base","secure":false}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("v1 create: %d %s", w.Code, w.Body)
	}
	if got = decode(t, w); got["envdAccessToken"] != nil {
		t.Fatalf("insecure v1 sandbox got a token: %v", got)
	}
	if got = decode(t, e2.do("POST", "/sandboxes", `{"templateID":"base"}`)); got["envdAccessToken"] == nil {
		t.Fatalf("v1 sandbox without 'secure' got no token: %v", got)
	}
}

func TestSandboxFlow(t *testing.T) {
	e := newEnv(t, envOpts{driver: func(o *driver.Options) {
		o.Features = append(o.Features, "egress-domains", "egress-proxy")
	}})
	sb := e.create(t, `{"templateID":"base","timeout":60,"metadata":{"k":"v"},"allow_internet_access":false,
		"network":{"allowOut":["1.1.1.1","*.example.com"],"egressProxy":{"address":"proxy:3128","username":"u","password":"secret"}}}`)
	id := sb["sandboxID"].(string)
	path := "/sandboxes/" + id

	w := e.do("GET", path, "")
	if w.Code != 200 {
		t.Fatalf("get: %d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), "secret") {
		t.Fatalf("detail leaks the proxy password: %s", w.Body)
	}
	d := decode(t, w)
	net := d["network"].(map[string]any)
	if d["state"] != "running" || d["cpuCount"] != 2.0 || d["memoryMB"] != 512.0 || d["diskSizeMB"] != 2048.0 ||
		d["metadata"].(map[string]any)["k"] != "v" || d["allowInternetAccess"] != false ||
		d["startedAt"] != "2025-06-01T12:00:00Z" || d["endAt"] != "2025-06-01T12:01:00Z" ||
		d["envdAccessToken"] != sb["envdAccessToken"] || d["clientID"] != ClientID || d["domain"] != nil ||
		net["allowPublicTraffic"] != true || len(net["allowOut"].([]any)) != 2 ||
		d["lifecycle"].(map[string]any)["onTimeout"] != "kill" || len(d["volumeMounts"].([]any)) != 0 {
		t.Fatalf("detail = %s", w.Body)
	}

	// Connect on a running sandbox: 200, TTL only extended.
	for _, p := range []string{"/v2" + path + "/connect", path + "/connect"} {
		w = e.do("POST", p, `{"timeout":10}`)
		if w.Code != 200 || decode(t, w)["sandboxID"] != id {
			t.Fatalf("connect %s: %d %s", p, w.Code, w.Body)
		}
	}
	if got := decode(t, e.do("GET", path, ""))["endAt"]; got != "2025-06-01T12:01:00Z" {
		t.Fatalf("connect shortened the TTL: %v", got)
	}
	if w = e.do("POST", "/v2"+path+"/connect", ""); w.Code != 200 {
		t.Fatalf("connect without body: %d %s", w.Code, w.Body)
	}
	if got := decode(t, e.do("GET", path, ""))["endAt"]; got != "2025-06-01T12:05:00Z" {
		t.Fatalf("connect default timeout: endAt %v", got)
	}

	// setTimeout and refreshes answer 204 with no body.
	for _, c := range []struct{ path, body, endAt string }{
		{path + "/timeout", `{"timeout":30}`, "2025-06-01T12:00:30Z"},
		{path + "/refreshes", `{"duration":120}`, "2025-06-01T12:02:00Z"},
		{path + "/refreshes", `{"duration":5}`, "2025-06-01T12:02:00Z"},
	} {
		w = e.do("POST", c.path, c.body)
		if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
			t.Fatalf("%s %s: %d %q", c.path, c.body, w.Code, w.Body)
		}
		if got := decode(t, e.do("GET", path, ""))["endAt"]; got != c.endAt {
			t.Fatalf("%s %s: endAt %v, want %s", c.path, c.body, got, c.endAt)
		}
	}
	for _, c := range []struct{ path, body, msg string }{
		{path + "/timeout", ``, "request body is required"},
		{path + "/timeout", `{}`, "timeout is required"},
		{path + "/timeout", `{"timeout":"5"}`, `"timeout": expected an integer`},
		{path + "/timeout", `{"timeout":-5}`, "must not be negative"},
		{path + "/timeout", `{"timeout":86401}`, "exceeds the maximum"},
		{path + "/refreshes", `{"duration":3601}`, "at most 3600"},
		{path + "/refreshes", `{"duration":-1}`, "must not be negative"},
		{path + "/connect", `{"timeout":true}`, `"timeout": expected an integer`},
		{path + "/connect", `{"timeout":86401}`, "exceeds the maximum"},
	} {
		wantError(t, e.do("POST", c.path, c.body), 400, c.msg)
	}

	// Metrics: one current sample from the record.
	w = e.do("GET", path+"/metrics", "")
	ms := decodeList(t, w)
	if w.Code != 200 || len(ms) != 1 || ms[0]["cpuCount"] != 2.0 || ms[0]["memTotal"] != float64(512<<20) ||
		ms[0]["timestamp"] != "2025-06-01T12:00:00Z" || ms[0]["timestampUnix"] != float64(t0.Unix()) {
		t.Fatalf("metrics = %d %s", w.Code, w.Body)
	}
	if ms := decodeList(t, e.do("GET", path+"/metrics?start=1&end=2", "")); len(ms) != 0 {
		t.Fatalf("metrics outside the window: %v", ms)
	}
	wantError(t, e.do("GET", path+"/metrics?start=abc", ""), 400, "start must be a non-negative integer")
	wantError(t, e.do("GET", path+"/metrics?start=5&end=4", ""), 400, "start must not be after end")

	// Kill: 204 without body, then everything is 404 with E2B's JSON.
	w = e.do("DELETE", path, "")
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Fatalf("kill: %d %q", w.Code, w.Body)
	}
	if e.node.Alive(id) {
		t.Fatal("killed sandbox still runs")
	}
	msg := `sandbox "` + id + `" not found`
	for _, c := range []struct{ method, path, body string }{
		{"DELETE", path, ""},
		{"GET", path, ""},
		{"POST", "/v2" + path + "/connect", `{"timeout":10}`},
		{"POST", path + "/timeout", `{"timeout":10}`},
		{"POST", path + "/refreshes", `{}`},
		{"GET", path + "/metrics", ""},
	} {
		wantError(t, e.do(c.method, c.path, c.body), 404, msg)
	}
	wantError(t, e.do("DELETE", "/sandboxes/nonexistingsandbox", ""), 404, `sandbox "nonexistingsandbox" not found`)
}

func TestTimeoutExpiryThroughAPI(t *testing.T) {
	e := newEnv(t, envOpts{})
	id := e.create(t, `{"templateID":"base","timeout":5}`)["sandboxID"].(string)
	e.clock.Advance(6 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for e.node.Alive(id) {
		if time.Now().After(deadline) {
			t.Fatal("sandbox outlived its timeout")
		}
		time.Sleep(time.Millisecond)
	}
	for {
		w := e.do("GET", "/sandboxes/"+id, "")
		if w.Code == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expired sandbox still visible: %d", w.Code)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCapacityStatus(t *testing.T) {
	t.Run("max sandboxes → 429", func(t *testing.T) {
		e := newEnv(t, envOpts{driver: func(o *driver.Options) { o.MaxSandboxes = 1 }})
		e.create(t, `{"templateID":"base"}`)
		w := e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`)
		wantError(t, w, http.StatusTooManyRequests, "no capacity for another sandbox")
		if decode(t, w)["error_code"] != "sandbox_capacity_unavailable" {
			t.Fatalf("error_code missing: %s", w.Body)
		}
		if w.Header().Get("Retry-After") != "" {
			t.Fatal("capacity answers must not invite the SDK to retry at once")
		}
	})
	t.Run("boot slots busy → 503", func(t *testing.T) {
		gate := make(chan struct{})
		e := newEnv(t, envOpts{driver: func(o *driver.Options) {
			o.BootConcurrency = 1
			o.BootQueueTimeout = 20 * time.Millisecond
		}})
		e.node.Set(func(n *drivertest.Node) { n.Gate = gate; n.Entered = make(chan string, 4) })
		done := make(chan int, 1)
		go func() { done <- e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`).Code }()
		<-e.node.Entered
		wantError(t, e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`), http.StatusServiceUnavailable,
			"too many sandboxes are starting")
		close(gate)
		if code := <-done; code != http.StatusCreated {
			t.Fatalf("first create: %d", code)
		}
	})
	t.Run("node failure → 500 without internals", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		e.node.Set(func(n *drivertest.Node) { n.CreateErr = errBootPath })
		w := e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`)
		wantError(t, w, 500, "failed to start the sandbox")
		if strings.Contains(w.Body.String(), "/var/lib") {
			t.Fatalf("leaks host path: %s", w.Body)
		}
		if e.records(t) != 0 {
			t.Fatal("failed create left a record")
		}
	})
}

type pathErr struct{}

func (pathErr) Error() string { return "mount /var/lib/vmon/templates/base: no such file" }

var errBootPath error = pathErr{}
