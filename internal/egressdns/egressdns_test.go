package egressdns

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vibemon/vmon/internal/egress"
)

// upstream is a DNS server for egress.TestZone that logs every question.
type upstream struct {
	addr  string
	mu    sync.Mutex
	asked []string
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	zone := egress.TestZone()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		name := strings.TrimSuffix(q.Name, ".")
		u.mu.Lock()
		u.asked = append(u.asked, name)
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		for _, a := range zone[name] {
			if q.Qtype == dns.TypeA && a.Is4() {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: a.AsSlice()})
			}
		}
		if len(zone[name]) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

func (u *upstream) questions() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.asked...)
}

func TestFilteringResolver(t *testing.T) {
	up := startUpstream(t)
	var mu sync.Mutex
	var refused []Refusal
	r, err := New(Config{Upstreams: []string{up.addr}, OnRefuse: func(x Refusal) {
		mu.Lock()
		refused = append(refused, x)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(pc, ln)
	t.Cleanup(func() { r.Close(); pc.Close(); ln.Close() })
	// No wait for the servers: the sockets are bound, so a query sent before Serve reads queues.

	guest := netip.MustParseAddr("127.0.0.1")
	deny, _ := egress.Parse(egress.Config{AllowOut: []string{"a.test", "*.b.test"}, DenyOut: []string{egress.AllTraffic}})
	r.Set(guest, netip.Addr{}, deny)
	ask := func(network, addr, name string) *dns.Msg {
		t.Helper()
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		resp, _, err := c.Exchange(m, addr)
		if err != nil {
			t.Fatalf("%s %s: %v", network, name, err)
		}
		return resp
	}
	for _, n := range []struct{ network, addr string }{{"udp", pc.LocalAddr().String()}, {"tcp", ln.Addr().String()}} {
		resp := ask(n.network, n.addr, "a.test")
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "203.0.113.10" {
			t.Fatalf("%s allowed name: %v", n.network, resp)
		}
		if resp := ask(n.network, n.addr, "deep.x.b.test"); resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s wildcard: %v", n.network, resp)
		}
		for _, name := range []string{"other.test", "b.test", "c2VjcmV0LWRhdGE.exfil.test"} {
			if resp := ask(n.network, n.addr, name); resp.Rcode != dns.RcodeRefused {
				t.Fatalf("%s %s: rcode %d, want REFUSED", n.network, name, resp.Rcode)
			}
		}
	}
	for _, q := range up.questions() {
		if q != "a.test" && q != "deep.x.b.test" {
			t.Fatalf("the upstream was asked %q: a refused name left the node", q)
		}
	}
	mu.Lock()
	if len(refused) != 6 || refused[0].Name != "other.test" || refused[0].Guest != guest {
		t.Fatalf("refusals %+v", refused)
	}
	mu.Unlock()
	// Learned with the TTL clamped to at least 30 s (the upstream said 5).
	if name, ok := r.NameOf(guest, netip.MustParseAddr("203.0.113.10")); !ok || name != "a.test" {
		t.Fatalf("learned: %q %v", name, ok)
	}

	// A policy that reaches any address anyway forwards everything.
	r.Set(guest, netip.Addr{}, egress.Policy{})
	if resp := ask("udp", pc.LocalAddr().String(), "other.test"); resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("allow-all: %v", resp)
	}
	// An unknown source gets no answer at all.
	r.Remove(guest)
	c := &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	if resp, _, err := c.Exchange(m, pc.LocalAddr().String()); err == nil {
		t.Fatalf("unknown guest got an answer: %v", resp)
	}
}

func TestDecide(t *testing.T) {
	every, _ := egress.Parse(egress.Config{AllowOut: []string{egress.AllTraffic}, DenyOut: []string{egress.AllTraffic}})
	deny, _ := egress.Parse(egress.Config{DenyOut: []string{egress.AllTraffic}})
	some, _ := egress.Parse(egress.Config{DenyOut: []string{"203.0.113.0/24"}})
	star, _ := egress.Parse(egress.Config{AllowOut: []string{"*"}, DenyOut: []string{egress.AllTraffic}})
	for _, c := range []struct {
		p    egress.Policy
		name string
		want bool
	}{
		{egress.Policy{}, "anything.test.", true},
		{every, "anything.test.", true},
		{some, "anything.test.", true},
		{deny, "a.test.", false},
		{star, "anything.test.", true},
		{star, "10.0.0.1.", false},
	} {
		if got := Decide(c.p, c.name); got != c.want {
			t.Errorf("Decide(%+v, %q) = %v", c.p, c.name, got)
		}
	}
}
