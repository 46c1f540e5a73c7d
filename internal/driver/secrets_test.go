package driver

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/secrets"
)

func withSecrets(t *testing.T) func(*Options) {
	sealer, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), secrets.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return func(o *Options) {
		o.Secrets = sealer
		o.Features = []string{FeatureNetTap, egress.FeatureDomains, egress.FeatureProxy}
	}
}

// The secrets API: values are write-only and sealed, versions count updates, names are unique
// and case-insensitive, ids and names both address a secret.
func TestSecretsLifecycle(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, withSecrets(t))
	s, err := e.d.CreateSecret(ctx, "OpenAI", "sk-1", map[string]string{"team": "ml"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.ID, secrets.IDPrefix) || s.Name != "openai" || s.Version != 1 || s.Sealed != nil {
		t.Fatalf("created %+v", s)
	}
	if _, err := e.d.CreateSecret(ctx, "OPENAI", "x", nil); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	raw, _ := e.store.GetSecret(ctx, s.ID)
	if strings.Contains(string(raw.Sealed), "sk-1") {
		t.Fatal("the value is stored in the clear")
	}
	if v, ok := e.d.SecretValue(ctx, "openai"); !ok || v != "sk-1" {
		t.Fatalf("SecretValue: %q %v", v, ok)
	}
	u, err := e.d.UpdateSecret(ctx, "openai", "sk-2", nil)
	if err != nil || u.Version != 2 || u.Metadata["team"] != "ml" {
		t.Fatalf("update: %+v %v", u, err)
	}
	if v, _ := e.d.SecretValue(ctx, "openai"); v != "sk-2" {
		t.Fatalf("after update: %q", v)
	}
	if g, err := e.d.GetSecret(ctx, s.ID); err != nil || g.Name != "openai" || g.Sealed != nil {
		t.Fatalf("get by id: %+v %v", g, err)
	}
	for _, bad := range []struct{ name, value string }{{"", "v"}, {"a{b", "v"}, {"sec_x", "v"}, {"ok", ""}} {
		if _, err := e.d.CreateSecret(ctx, bad.name, bad.value, nil); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("create %q=%q: %v", bad.name, bad.value, err)
		}
	}
	// Paging.
	for _, n := range []string{"b", "c", "d"} {
		if _, err := e.d.CreateSecret(ctx, n, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	tok := ""
	for {
		page, next, err := e.d.ListSecrets(ctx, 3, tok)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			names = append(names, p.Name)
		}
		if next == "" {
			break
		}
		tok = next
	}
	// The test clock stands still, so the order is by id: compare as a set.
	slices.Sort(names)
	if strings.Join(names, ",") != "b,c,d,openai" {
		t.Fatalf("paged list: %v", names)
	}
	if err := e.d.DeleteSecret(ctx, "openai"); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.d.SecretValue(ctx, "openai"); ok {
		t.Fatal("a deleted secret still opens")
	}
	if err := e.d.DeleteSecret(ctx, "openai"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

// A header rule naming an unknown secret is refused at create (and by a live update, which goes
// through the same check); identity tokens are not supported.
func TestRulesNeedExistingSecrets(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, withSecrets(t))
	rule := func(v string) *Network {
		return &Network{Rules: map[string][]NetworkRule{"api.example.com": {{Transform: &NetworkTransform{Headers: map[string]string{"Authorization": v}}}}}}
	}
	for v, msg := range map[string]string{
		"Bearer ${e2b.secrets.missing}":   `secret "missing" does not exist`,
		"${e2b.identity.tokens.github}":   "workload identity tokens are not supported",
		"Bearer ${e2b.secrets.sec_thing}": "reserved",
	} {
		_, err := e.d.Create(ctx, CreateRequest{Template: "base", Network: rule(v)})
		if !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v", v, err)
		}
	}
	if _, err := e.d.CreateSecret(ctx, "present", "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Create(ctx, CreateRequest{Template: "base", Network: rule("Bearer ${e2b.secrets.PRESENT}")}); err != nil {
		t.Fatalf("existing secret: %v", err)
	}
	// A server without secrets refuses placeholders rather than passing them through.
	e2 := newEnv(t, func(o *Options) { o.Features = []string{FeatureNetTap, egress.FeatureProxy} })
	if _, err := e2.d.Create(ctx, CreateRequest{Template: "base", Network: rule("${e2b.secrets.present}")}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("without secrets: %v", err)
	}
	if _, _, err := e2.d.ListSecrets(ctx, 0, ""); err == nil {
		t.Fatal("the secrets API answered without a sealer")
	}
}
