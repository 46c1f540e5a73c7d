package server_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestMetricsEnvsHealthCORS(t *testing.T) {
	e := startEnv(t)
	status, body, _ := doRequest(t, "GET", e.url+"/metrics", "", nil, nil)
	var m map[string]float64
	if status != 200 || json.Unmarshal(body, &m) != nil {
		t.Fatalf("metrics: %d %s", status, body)
	}
	for _, k := range []string{"ts", "cpu_count", "mem_total", "mem_total_mib", "disk_total"} {
		if m[k] <= 0 {
			t.Errorf("metrics %s = %v (%s)", k, m[k], body)
		}
	}
	for _, k := range []string{"cpu_used_pct", "mem_used", "mem_cache", "mem_used_mib", "disk_used"} {
		if _, ok := m[k]; !ok {
			t.Errorf("metrics lacks %s (%s)", k, body)
		}
	}
	e.initEnvd(t, map[string]any{"envVars": map[string]string{"X": "1"}})
	status, body, _ = doRequest(t, "GET", e.url+"/envs", "", nil, nil)
	if status != 200 || string(body) != "{\"X\":\"1\"}\n" {
		t.Fatalf("envs: %d %s", status, body)
	}
	status, _, hdr := doRequest(t, "GET", e.url+"/health", "", nil, map[string]string{"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "49983"})
	if status != http.StatusNoContent || hdr.Get("X-Envd-Version") == "" {
		t.Fatalf("health: %d %v", status, hdr)
	}
	// Browser preflights are answered without a token.
	e.initEnvd(t, map[string]any{"accessToken": "cors-token"})
	status, _, hdr = doRequest(t, "OPTIONS", e.url+"/process.Process/Start", "", nil, map[string]string{
		"Origin": "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-access-token,content-type",
	})
	if status != http.StatusNoContent || hdr.Get("Access-Control-Allow-Origin") != "*" || hdr.Get("Access-Control-Allow-Headers") != "x-access-token,content-type" {
		t.Fatalf("preflight: %d %v", status, hdr)
	}
}
