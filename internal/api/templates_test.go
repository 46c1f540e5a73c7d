package api

import (
	"testing"
)

func TestTemplates(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.create(t, `{"templateID":"base"}`)

	list := decodeList(t, e.do("GET", "/templates", ""))
	if len(list) != 2 {
		t.Fatalf("templates = %v", list)
	}
	base := list[0]
	if base["templateID"] != baseID || base["buildStatus"] != "ready" || base["cpuCount"] != 2.0 ||
		base["memoryMB"] != 512.0 || base["diskSizeMB"] != 2048.0 || base["envdVersion"] != "0.6.13" ||
		base["spawnCount"] != 1.0 || base["buildCount"] != 1.0 || base["createdBy"] != nil ||
		base["lastSpawnedAt"] != "2025-06-01T12:00:00Z" || base["names"].([]any)[0] != "base" ||
		base["aliases"].([]any)[0] != "base" {
		t.Fatalf("base template = %v", base)
	}
	if _, ok := base["rootfs"]; ok {
		t.Fatal("template listing exposes host paths")
	}
	if wip := list[1]; wip["buildStatus"] != "building" || wip["lastSpawnedAt"] != nil {
		t.Fatalf("wip template = %v", wip)
	}

	for _, ref := range []string{baseID, "base", "base:default"} {
		w := e.do("GET", "/templates/"+ref, "")
		got := decode(t, w)
		builds, _ := got["builds"].([]any)
		if w.Code != 200 || got["templateID"] != baseID || len(builds) != 1 ||
			builds[0].(map[string]any)["status"] != "ready" || builds[0].(map[string]any)["finishedAt"] == nil {
			t.Fatalf("GET /templates/%s = %d %s", ref, w.Code, w.Body)
		}
	}
	wantError(t, e.do("GET", "/templates/nope", ""), 404, `template "nope" not found`)

	w := e.do("GET", "/templates/aliases/base", "")
	if got := decode(t, w); w.Code != 200 || got["templateID"] != baseID || got["public"] != false {
		t.Fatalf("alias = %d %s", w.Code, w.Body)
	}
	wantError(t, e.do("GET", "/templates/aliases/nope", ""), 404, "not found")
}
