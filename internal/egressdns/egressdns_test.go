package egressdns

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
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
	msgs  []*dns.Msg
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
		u.msgs = append(u.msgs, r.Copy())
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

func (u *upstream) messages() []*dns.Msg {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*dns.Msg(nil), u.msgs...)
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

// startResolver serves a resolver forwarding to up on loopback, with guest 127.0.0.1 under p.
func startResolver(t *testing.T, up *upstream, p egress.Policy) (udp, tcp string) {
	t.Helper()
	r, err := New(Config{Upstreams: []string{up.addr}})
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(pc, ln)
	t.Cleanup(func() { r.Close(); pc.Close(); ln.Close() })
	r.Set(netip.MustParseAddr("127.0.0.1"), netip.Addr{}, p)
	return pc.LocalAddr().String(), ln.Addr().String()
}

// What leaves the node is the resolver's own question: the lower-case name, class IN, a fresh id,
// RD alone, its own EDNS record; nothing the guest added (0x20 case, id, CD/AD, the DO bit, EDNS
// options, extra records) reaches the upstream. The guest's answer matches its question as asked.
func TestCanonicalForwarding(t *testing.T) {
	up := startUpstream(t)
	deny, _ := egress.Parse(egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic}})
	udp, tcp := startResolver(t, up, deny)
	for _, n := range []struct{ network, addr string }{{"udp", udp}, {"tcp", tcp}} {
		guestQ := new(dns.Msg)
		guestQ.Id = 0x1234
		guestQ.RecursionDesired = true
		guestQ.CheckingDisabled = true
		guestQ.AuthenticatedData = true
		guestQ.Question = []dns.Question{{Name: "A.tEsT.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(4000)
		opt.SetDo()
		opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("c2VjcmV0")},
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		guestQ.Extra = []dns.RR{
			&dns.TXT{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"secret"}},
			opt,
		}
		before := len(up.messages())
		c := &dns.Client{Net: n.network, Timeout: 3 * time.Second}
		resp, _, err := c.Exchange(guestQ, n.addr)
		if err != nil {
			t.Fatalf("%s: %v", n.network, err)
		}
		msgs := up.messages()
		if len(msgs) != before+1 {
			t.Fatalf("%s: the upstream was asked %d times", n.network, len(msgs)-before)
		}
		got := msgs[len(msgs)-1]
		if len(got.Question) != 1 || got.Question[0] != (dns.Question{Name: "a.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET}) {
			t.Fatalf("%s: upstream question %v", n.network, got.Question)
		}
		if got.Id == guestQ.Id || got.CheckingDisabled || got.AuthenticatedData || !got.RecursionDesired || got.Opcode != dns.OpcodeQuery {
			t.Fatalf("%s: upstream header carries the guest's: %+v", n.network, got.MsgHdr)
		}
		if len(got.Answer) != 0 || len(got.Ns) != 0 || len(got.Extra) != 1 {
			t.Fatalf("%s: upstream sections: %v", n.network, got)
		}
		o := got.IsEdns0()
		if o == nil || o.Do() || len(o.Option) != 0 || o.UDPSize() != upstreamUDPSize || o.Version() != 0 {
			t.Fatalf("%s: upstream EDNS: %v", n.network, o)
		}
		// The answer is for the guest's question as it asked it.
		if resp.Id != 0x1234 || !resp.Response || !resp.RecursionDesired || !resp.CheckingDisabled || resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s: answer header %+v", n.network, resp.MsgHdr)
		}
		if len(resp.Question) != 1 || resp.Question[0].Name != "A.tEsT." {
			t.Fatalf("%s: answer question %v", n.network, resp.Question)
		}
		if len(resp.Answer) != 1 || resp.Answer[0].Header().Name != "A.tEsT." || resp.Answer[0].(*dns.A).A.String() != "203.0.113.10" {
			t.Fatalf("%s: answer %v", n.network, resp.Answer)
		}
		if o := resp.IsEdns0(); o == nil || len(o.Option) != 0 {
			t.Fatalf("%s: answer EDNS %v", n.network, o)
		}
	}
	// A plain query gets a plain answer (no EDNS record it did not ask for).
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, udp)
	if err != nil || resp.Rcode != dns.RcodeSuccess || resp.IsEdns0() != nil {
		t.Fatalf("plain query: %v %v", resp, err)
	}

	// Class other than IN, a type outside the short list, another opcode: refused, never asked.
	before := len(up.messages())
	for _, c := range []struct {
		what  string
		q     dns.Question
		op    int
		rcode int
	}{
		{"class CH", dns.Question{Name: "a.test.", Qtype: dns.TypeA, Qclass: dns.ClassCHAOS}, dns.OpcodeQuery, dns.RcodeRefused},
		{"type NULL", dns.Question{Name: "a.test.", Qtype: dns.TypeNULL, Qclass: dns.ClassINET}, dns.OpcodeQuery, dns.RcodeRefused},
		{"type 65280", dns.Question{Name: "a.test.", Qtype: 65280, Qclass: dns.ClassINET}, dns.OpcodeQuery, dns.RcodeRefused},
		{"type ANY", dns.Question{Name: "a.test.", Qtype: dns.TypeANY, Qclass: dns.ClassINET}, dns.OpcodeQuery, dns.RcodeRefused},
		{"NOTIFY", dns.Question{Name: "a.test.", Qtype: dns.TypeSOA, Qclass: dns.ClassINET}, dns.OpcodeNotify, dns.RcodeNotImplemented},
	} {
		m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: dns.Id(), Opcode: c.op, RecursionDesired: true}, Question: []dns.Question{c.q}}
		resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, udp)
		if err != nil || resp.Rcode != c.rcode {
			t.Fatalf("%s: %v %v", c.what, resp, err)
		}
	}
	two := new(dns.Msg).SetQuestion("a.test.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "x.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	if resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(two, udp); err != nil || resp.Rcode != dns.RcodeFormatError {
		t.Fatalf("two questions: %v %v", resp, err)
	}
	if got := up.messages()[before:]; len(got) != 0 {
		t.Fatalf("refused questions reached the upstream: %v", got)
	}
}

// Without configured upstreams the resolver follows resolv.conf; a node with none still starts,
// and guests get SERVFAIL rather than an answer from anywhere else.
func TestResolvConf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte("# none yet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{ResolvConf: path})
	if err != nil {
		t.Fatal(err)
	}
	if ups := r.currentUpstreams(); len(ups) != 0 {
		t.Fatalf("upstreams %v", ups)
	}
	if _, err := r.forward(new(dns.Msg).SetQuestion("a.test.", dns.TypeA)); err == nil {
		t.Fatal("forwarded without an upstream")
	}
	if err := os.WriteFile(path, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	_ = os.Chtimes(path, later, later)
	r.upMu.Lock()
	r.upChecked = time.Now().Add(-resolvConfEvery)
	r.upMu.Unlock()
	if ups := r.currentUpstreams(); len(ups) != 1 || ups[0] != "192.0.2.53:53" {
		t.Fatalf("after the change: %v", ups)
	}
}
