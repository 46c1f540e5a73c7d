package store

import (
	"context"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// A key made elsewhere (--admin-key-file) becomes valid once, whatever the number of starts; a
// revoked one stays revoked.
func testEnsureAPIKey(t *testing.T, s *Store) {
	ctx := context.Background()
	const plain = "e2b_0123456789abcdef0123456789abcdef01234567"
	for range 2 {
		k, err := s.EnsureAPIKey(ctx, "admin", plain, time.Now())
		if err != nil || k.Name != "admin" {
			t.Fatalf("EnsureAPIKey: %+v %v", k, err)
		}
	}
	if keys, _ := s.ListAPIKeys(ctx); len(keys) != 1 {
		t.Fatalf("%d keys after two starts, want 1", len(keys))
	}
	if _, err := s.VerifyAPIKey(ctx, plain); err != nil {
		t.Fatal(err)
	}
	keys, _ := s.ListAPIKeys(ctx)
	if err := s.RevokeAPIKey(ctx, keys[0].ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureAPIKey(ctx, "admin", plain, time.Now()); !errdefs.Is(err, errdefs.KindUnauthorized) {
		t.Fatalf("a revoked key: %v", err)
	}
	if _, err := s.EnsureAPIKey(ctx, "admin", "e2b_XYZ", time.Now()); err == nil {
		t.Fatal("a malformed key was stored")
	}
}
