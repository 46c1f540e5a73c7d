package guestnet

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.2/30"), Gateway: netip.MustParseAddr("172.20.0.1")}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no interface", func(c *Config) { c.Interface = "" }, "interface name"},
		{"interface of 16 characters", func(c *Config) { c.Interface = strings.Repeat("e", 16) }, "interface name"},
		{"no address", func(c *Config) { c.Address = netip.Prefix{} }, "address is missing"},
		{"IPv6 address", func(c *Config) { c.Address = netip.MustParsePrefix("2001:db8::2/64") }, "not IPv4"},
		{"v4-mapped address", func(c *Config) { c.Address = netip.MustParsePrefix("::ffff:172.20.0.2/126") }, "not IPv4"},
		{"network address", func(c *Config) { c.Address = netip.MustParsePrefix("172.20.0.0/30") }, "network or broadcast"},
		{"broadcast address", func(c *Config) { c.Address = netip.MustParsePrefix("172.20.0.3/30") }, "network or broadcast"},
		{"host route", func(c *Config) { c.Address = netip.MustParsePrefix("172.20.0.2/32") }, "no other host"},
		{"gateway is the network", func(c *Config) { c.Gateway = netip.MustParseAddr("172.20.0.0") }, "not another host"},
		{"gateway is the broadcast", func(c *Config) { c.Gateway = netip.MustParseAddr("172.20.0.3") }, "not another host"},
		{"no gateway", func(c *Config) { c.Gateway = netip.Addr{} }, "gateway"},
		{"gateway outside", func(c *Config) { c.Gateway = netip.MustParseAddr("172.20.0.5") }, "not another host"},
		{"gateway is the guest", func(c *Config) { c.Gateway = c.Address.Addr() }, "not another host"},
		{"IPv6 gateway", func(c *Config) { c.Gateway = netip.MustParseAddr("fe80::1") }, "not an IPv4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// A /31 has no network or broadcast address (RFC 3021): both ends are hosts.
	p31 := Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.0/31"), Gateway: netip.MustParseAddr("172.20.0.1")}
	if err := p31.Validate(); err != nil {
		t.Errorf("/31: %v", err)
	}
	// 15 characters is IFNAMSIZ-1: the longest name Linux accepts.
	c := good
	c.Interface = strings.Repeat("e", 15)
	if err := c.Validate(); err != nil {
		t.Errorf("15-character interface: %v", err)
	}
}

// The JSON form is what the node sends in envd's /init body.
func TestJSON(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(`{"interface":"eth0","address":"172.20.0.6/30","gateway":"172.20.0.5"}`), &c); err != nil {
		t.Fatal(err)
	}
	want := Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.6/30"), Gateway: netip.MustParseAddr("172.20.0.5")}
	if c != want {
		t.Fatalf("decoded %+v, want %+v", c, want)
	}
	if err := json.Unmarshal([]byte(`{"interface":"eth0","address":"172.20.0.300/30"}`), &c); err == nil {
		t.Fatal("a malformed address decoded")
	}
}
