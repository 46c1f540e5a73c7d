package template

import "testing"

func TestMissingPackages(t *testing.T) {
	m := Manifest{Packages: []string{"a", "b"}}
	if got := m.MissingPackages([]string{"a", "c", "b", "d"}); len(got) != 2 || got[0] != "c" || got[1] != "d" {
		t.Fatalf("MissingPackages = %v", got)
	}
	if got := m.MissingPackages([]string{"b"}); got != nil {
		t.Fatalf("nothing missing: %v", got)
	}
}
