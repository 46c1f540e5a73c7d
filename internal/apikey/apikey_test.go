package apikey

import (
	"regexp"
	"strings"
	"testing"
)

var keyRE = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

func TestGenerate(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		k, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		if !keyRE.MatchString(k.Plain) {
			t.Fatalf("key %q does not match %s", k.Plain, keyRE)
		}
		if seen[k.Plain] {
			t.Fatalf("duplicate key %q", k.Plain)
		}
		seen[k.Plain] = true
		if !Verify(k.Plain, k.Hash) {
			t.Fatal("Verify rejected its own hash")
		}
		if strings.Contains(k.Hash, k.Plain[4:]) || strings.Contains(k.Mask, k.Plain[4:20]) {
			t.Fatal("hash or mask leaks the secret")
		}
		if want := "e2b_…" + k.Plain[len(k.Plain)-4:]; k.Mask != want {
			t.Fatalf("mask = %q, want %q", k.Mask, want)
		}
		if !WellFormed(k.Plain) {
			t.Fatal("WellFormed rejected a generated key")
		}
	}
}

func TestVerify(t *testing.T) {
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, plain, hash string
		want              bool
	}{
		{"match", k.Plain, k.Hash, true},
		{"other key", other.Plain, k.Hash, false},
		{"empty key", "", k.Hash, false},
		{"empty hash", k.Plain, "", false},
		{"uppercase hash", k.Plain, strings.ToUpper(k.Hash), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verify(tc.plain, tc.hash); got != tc.want {
				t.Fatalf("Verify = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWellFormed(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"e2b_" + strings.Repeat("a1", 20), true},
		{"e2b_" + strings.Repeat("A1", 20), false},
		{"e2b_" + strings.Repeat("a", 39), false},
		{"e2b_" + strings.Repeat("a", 41), false},
		{"e2c_" + strings.Repeat("a", 40), false},
		{"e2b_" + strings.Repeat("g", 40), false},
		{"", false},
	} {
		if got := WellFormed(tc.in); got != tc.want {
			t.Errorf("WellFormed(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestMaskShort(t *testing.T) {
	if got := Mask("x"); got != "e2b_…" {
		t.Fatalf("Mask(short) = %q", got)
	}
}
