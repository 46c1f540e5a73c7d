package netclaim

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

// A second node in one namespace with the first one's scope, NFLOG group or an overlapping pool
// is refused, naming the flag to change; distinct settings coexist; a released claim is free.
func TestClaim(t *testing.T) {
	dir := t.TempDir()
	want := func(scope, pool string, group uint16) Want {
		return Want{Scope: scope, Pool: netip.MustParsePrefix(pool), LogGroup: group}
	}
	first, err := Claim(dir, want("vmon", "172.20.0.0/16", 5380))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		w    Want
		flag string
	}{
		{want("vmon", "172.21.0.0/16", 5381), "--net-scope"},
		{want("vmonb", "172.21.0.0/16", 5381), "--net-scope"},
		{want("vm", "172.21.0.0/16", 5381), "--net-scope"},
		{want("nodeb", "172.21.0.0/16", 5380), "--nflog-group"},
		{want("nodeb", "172.20.5.0/24", 5381), "--net-pool"},
		{want("nodeb", "172.16.0.0/12", 5381), "--net-pool"},
		{want("nodeb", "172.20.0.0/16", 5381), "--net-pool"},
	} {
		c, err := Claim(dir, tc.w)
		if err == nil {
			c.Release()
			t.Fatalf("%+v claimed beside the first node", tc.w)
		}
		if !strings.Contains(err.Error(), tc.flag) {
			t.Fatalf("%+v: %v, want a hint at %s", tc.w, err, tc.flag)
		}
	}
	second, err := Claim(dir, want("nodeb", "172.21.0.0/16", 5381))
	if err != nil {
		t.Fatalf("distinct settings: %v", err)
	}
	second.Release()
	first.Release()
	again, err := Claim(dir, want("vmon", "172.20.0.0/16", 5380))
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	again.Release()
}

// Two nodes starting at the same instant with overlapping (not equal) pools: exactly one gets
// its claims, every time.
func TestClaimRace(t *testing.T) {
	dir := t.TempDir()
	for i := range 200 {
		var wg sync.WaitGroup
		got := make([]*Claims, 2)
		for j, pool := range []string{"10.64.0.0/16", "10.64.128.0/17"} {
			wg.Go(func() {
				c, err := Claim(dir, Want{Scope: fmt.Sprintf("n%c%d", 'a'+j, i), Pool: netip.MustParsePrefix(pool), LogGroup: uint16(100 + j)})
				if err == nil {
					got[j] = c
				}
			})
		}
		wg.Wait()
		if (got[0] == nil) == (got[1] == nil) {
			t.Fatalf("round %d: both or neither of two overlapping pools claimed: %v", i, got)
		}
		for _, c := range got {
			if c != nil {
				c.Release()
			}
		}
	}
}
