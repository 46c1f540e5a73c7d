package secrets

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSealBindsIDAndVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), KeyFile)
	s, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	sealed, err := s.Seal("sec_a", 1, "hunter2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), "hunter2") {
		t.Fatal("value in the clear")
	}
	if v, err := s.Open("sec_a", 1, sealed); err != nil || v != "hunter2" {
		t.Fatalf("open: %q %v", v, err)
	}
	for _, c := range []struct {
		id string
		v  int64
	}{{"sec_b", 1}, {"sec_a", 2}} {
		if _, err := s.Open(c.id, c.v, sealed); err == nil {
			t.Fatalf("opened as %s v%d", c.id, c.v)
		}
	}
	// The same key after a restart; another key cannot open it.
	again, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := again.Open("sec_a", 1, sealed); err != nil || v != "hunter2" {
		t.Fatalf("reloaded key: %q %v", v, err)
	}
	other, _ := LoadOrCreateKey(filepath.Join(t.TempDir(), KeyFile))
	if _, err := other.Open("sec_a", 1, sealed); err == nil {
		t.Fatal("another key opened it")
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("a short key was accepted")
	}
}

func TestNamesValuesMetadata(t *testing.T) {
	if n, err := NormName("OpenAI-Key"); err != nil || n != "openai-key" {
		t.Fatalf("NormName: %q %v", n, err)
	}
	for _, bad := range []string{"", "a{b", "a}b", "a\nb", "sec_x", "SEC_x", strings.Repeat("a", MaxNameBytes+1)} {
		if _, err := NormName(bad); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, err := NormName(strings.Repeat("a", MaxNameBytes)); err != nil {
		t.Errorf("name of %d bytes: %v", MaxNameBytes, err)
	}
	if err := CheckValue(strings.Repeat("v", MaxValueBytes)); err != nil {
		t.Errorf("value at the limit: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("v", MaxValueBytes+1), "a\r\nX: y"} {
		if err := CheckValue(bad); err == nil {
			t.Errorf("value %.20q accepted", bad)
		}
	}
	big := map[string]string{}
	for i := range MaxMetadataEntries {
		big[strings.Repeat("k", 3)+string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	if err := CheckMetadata(big); err != nil {
		t.Errorf("%d entries: %v", MaxMetadataEntries, err)
	}
	big["one-more"] = "v"
	for name, m := range map[string]map[string]string{
		"33 entries": big,
		"long key":   {strings.Repeat("k", MaxMetadataKeyBytes+1): "v"},
		"long value": {"k": strings.Repeat("v", MaxMetadataValueBytes+1)},
		"empty key":  {"": "v"},
		"total":      {"a": strings.Repeat("v", 1000), "b": strings.Repeat("v", 1000), "c": strings.Repeat("v", 1000), "d": strings.Repeat("v", 1000), "e": strings.Repeat("v", 1000), "f": strings.Repeat("v", 1000), "g": strings.Repeat("v", 1000), "h": strings.Repeat("v", 1000), "i": strings.Repeat("v", 200)},
	} {
		if err := CheckMetadata(m); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	names, err := Placeholders("Bearer ${e2b.secrets.OpenAI} and ${e2b.secrets.other-one}")
	if err != nil || strings.Join(names, ",") != "openai,other-one" {
		t.Fatalf("Placeholders: %v %v", names, err)
	}
	for _, bad := range []string{"${e2b.identity.tokens.x}", "${e2b.vault.x}", "${e2b.secrets.}"} {
		if _, err := Placeholders(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if names, err := Placeholders("no placeholder, $ {e2b.secrets.x}"); err != nil || len(names) != 0 {
		t.Fatalf("plain value: %v %v", names, err)
	}
	vals := map[string]string{"openai": "sk-1"}
	lookup := func(n string) (string, bool) { v, ok := vals[n]; return v, ok }
	if got, ok := Fill("Bearer ${e2b.secrets.OPENAI}", lookup); !ok || got != "Bearer sk-1" {
		t.Fatalf("Fill: %q %v", got, ok)
	}
	if _, ok := Fill("Bearer ${e2b.secrets.gone}", lookup); ok {
		t.Fatal("a missing secret filled")
	}
}
