package guestnet

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// A kernel namespace stands in for the guest's stack (the e2e suites cover gVisor's netstack):
// the pushed address and route make the gateway reachable, a second push onto another lease
// leaves nothing of the first, and pushing twice changes nothing.
func TestApply(t *testing.T) {
	host := netnstest.New(t, "gnhost")
	guest := netnstest.New(t, "gnguest")
	netnstest.Veth(t, host, "gn0", guest, "eth0")
	host.AddAddr("gn0", netip.MustParsePrefix("172.20.0.1/30"))
	host.AddAddr("gn0", netip.MustParsePrefix("172.20.0.5/30"))
	host.Up("gn0")

	// Before the push the guest end is down and has no IPv4 address.
	if out := guest.MustRun("", "ip", "-4", "-o", "addr", "show", "eth0"); strings.TrimSpace(out) != "" {
		t.Fatalf("guest has an address before the push: %s", out)
	}
	first := Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.2/30"), Gateway: netip.MustParseAddr("172.20.0.1")}
	for range 2 {
		if err := guest.Do(func() error { return Apply(first) }); err != nil {
			t.Fatal(err)
		}
	}
	guest.WaitUp("eth0")
	addrs := guest.MustRun("", "ip", "-4", "-o", "addr", "show", "eth0")
	if strings.Count(addrs, "inet ") != 1 || !strings.Contains(addrs, "172.20.0.2/30") {
		t.Errorf("addresses after two pushes: %s", addrs)
	}
	if routes := guest.MustRun("", "ip", "-4", "route", "show", "default"); !strings.Contains(routes, "default via 172.20.0.1 dev eth0") {
		t.Errorf("default route: %s", routes)
	}
	if r := guest.Ping(netip.MustParseAddr("172.20.0.1"), 3*time.Second); r.Outcome != netnstest.Answered {
		t.Errorf("ping the gateway: %s (%v)", r.Outcome, r.Err)
	}

	// Resumed or forked onto another lease: the old address and route are gone.
	second := Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.6/30"), Gateway: netip.MustParseAddr("172.20.0.5")}
	if err := guest.Do(func() error { return Apply(second) }); err != nil {
		t.Fatal(err)
	}
	addrs = guest.MustRun("", "ip", "-4", "-o", "addr", "show", "eth0")
	if strings.Contains(addrs, "172.20.0.2/") || !strings.Contains(addrs, "172.20.0.6/30") {
		t.Errorf("addresses after moving to the second lease: %s", addrs)
	}
	if routes := guest.MustRun("", "ip", "-4", "route", "show", "default"); !strings.Contains(routes, "default via 172.20.0.5 dev eth0") || strings.Contains(routes, "172.20.0.1") {
		t.Errorf("default route after moving: %s", routes)
	}

	// A wrong interface or an invalid config is an error that says which, and changes nothing.
	bad := second
	bad.Interface = "eth9"
	if err := guest.Do(func() error { return Apply(bad) }); !errors.Is(err, ErrNoInterface) || !strings.Contains(err.Error(), "eth9") {
		t.Errorf("unknown interface: %v", err)
	}
	bad = second
	bad.Gateway = netip.MustParseAddr("10.0.0.1")
	if err := guest.Do(func() error { return Apply(bad) }); err == nil || !strings.Contains(err.Error(), "gateway") {
		t.Errorf("gateway outside the lease: %v", err)
	}
	if addrs2 := guest.MustRun("", "ip", "-4", "-o", "addr", "show", "eth0"); addrs2 != addrs {
		t.Errorf("a rejected push changed the addresses: %s → %s", addrs, addrs2)
	}
}
