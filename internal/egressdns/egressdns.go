// Package egressdns owns the node's filtering resolver (--egress-dns filter, the default; seed 002
// "Names"): guest DNS that a link's proxy slot redirected (UDP and TCP 53, to whatever server the
// guest asked) is answered here. A question only the sandbox's allowOut domains cover is forwarded
// to the node's own resolvers; any other is REFUSED, so a sandbox under deny-all cannot carry data
// out in query names. What is forwarded is rebuilt rather than relayed (Canonical): the lower-case
// name, class IN, one of the query types programs ask for, a fresh message id and the resolver's
// own flags, so nothing else the guest chose (0x20 letter case, id, CD/AD bits, EDNS options,
// extra records) leaves the node; the answer is given back under the guest's own question. Answers'
// A and AAAA addresses are remembered per sandbox with their TTL clamped to 30 s–1 h, which names
// the destinations of later refusals. The package never touches iptables or links (firewall and
// netpool redirect to it) and never answers from anywhere but the upstream it forwards to.
package egressdns

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/vibemon/vmon/internal/egress"
)

// TTL bounds of learned addresses (seed 002): a zero TTL would expire the address before the
// program connects; an hour keeps the table from holding stale names for long.
const (
	MinTTL = 30 * time.Second
	MaxTTL = time.Hour
	// maxLearned bounds the learned table per sandbox.
	maxLearned = 4096
	// upstreamUDPSize is the EDNS buffer size the resolver advertises upstream and to guests
	// that use EDNS (the DNS flag day 2020 value: fits a path MTU without fragments).
	upstreamUDPSize = 1232
	// resolvConfEvery is how often /etc/resolv.conf is looked at again, as Go's own resolver
	// does, so a node whose resolvers change (DHCP, systemd-resolved) follows them.
	resolvConfEvery = 5 * time.Second
)

// forwardedTypes are the query types forwarded upstream. The type is the one part of a question
// the resolver cannot canonicalise, so the choice is bounded to the types programs ask for
// (about four bits per question rather than sixteen); any other type is REFUSED.
var forwardedTypes = map[uint16]bool{
	dns.TypeA: true, dns.TypeAAAA: true, dns.TypeCNAME: true, dns.TypeMX: true, dns.TypeTXT: true,
	dns.TypeNS: true, dns.TypeSOA: true, dns.TypeSRV: true, dns.TypePTR: true, dns.TypeCAA: true,
	dns.TypeHTTPS: true, dns.TypeSVCB: true, dns.TypeNAPTR: true, dns.TypeDS: true,
	dns.TypeDNSKEY: true, dns.TypeTLSA: true, dns.TypeSSHFP: true,
}

// Refusal is a refused question, for the stream of what was blocked.
type Refusal struct {
	Guest netip.Addr
	Name  string
	Type  string
}

// Config configures a Resolver.
type Config struct {
	// Upstreams are the servers questions are forwarded to (host:port); empty follows
	// /etc/resolv.conf (read again at most every 5 s).
	Upstreams []string
	// ResolvConf overrides /etc/resolv.conf (tests).
	ResolvConf string
	// OnRefuse, when set, is called for every refused question.
	OnRefuse func(Refusal)
	// Timeout bounds one upstream exchange (default 5 s).
	Timeout time.Duration
	Log     *slog.Logger
}

// Resolver is the node's filtering resolver.
type Resolver struct {
	cfg Config
	log *slog.Logger

	upMu sync.Mutex
	// upstreams are the servers in use; upChecked is when resolv.conf was last looked at and
	// upMod its modification time then.
	// +checklocks:upMu
	upstreams []string
	// +checklocks:upMu
	upChecked time.Time
	// +checklocks:upMu
	upMod time.Time

	mu sync.RWMutex
	// +checklocks:mu
	guests map[netip.Addr]*guest

	servers []*dns.Server
}

type guest struct {
	policy egress.Policy
	mu     sync.Mutex
	// learned maps an address to the name it was learned for and when it expires.
	// +checklocks:mu
	learned map[netip.Addr]learned
}

type learned struct {
	name    string
	expires time.Time
}

// New returns a resolver; Serve starts it.
func New(cfg Config) (*Resolver, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	r := &Resolver{cfg: cfg, log: cfg.Log, guests: map[netip.Addr]*guest{}}
	if len(r.currentUpstreams()) == 0 {
		// Not fatal: the resolver is on by default, and a node without resolvers must still
		// start. Guests get SERVFAIL (never an unfiltered path) until resolv.conf names one.
		r.log.Warn("egress resolver: the node has no resolver to forward to yet; guest DNS fails until " + cfg.ResolvConf + " names one")
	}
	return r, nil
}

// currentUpstreams returns the servers to forward to: Config.Upstreams, or those of resolv.conf,
// read again when it changed and was last looked at more than resolvConfEvery ago. A file that
// cannot be read keeps the previous servers.
func (r *Resolver) currentUpstreams() []string {
	if len(r.cfg.Upstreams) > 0 {
		return r.cfg.Upstreams
	}
	r.upMu.Lock()
	defer r.upMu.Unlock()
	now := time.Now()
	if !r.upChecked.IsZero() && now.Sub(r.upChecked) < resolvConfEvery {
		return r.upstreams
	}
	r.upChecked = now
	fi, err := os.Stat(r.cfg.ResolvConf)
	if err != nil || (fi.ModTime().Equal(r.upMod) && r.upstreams != nil) {
		return r.upstreams
	}
	cc, err := dns.ClientConfigFromFile(r.cfg.ResolvConf)
	if err != nil {
		r.log.Warn("egress resolver: read the node's resolvers", "err", err)
		return r.upstreams
	}
	ups := []string{}
	for _, s := range cc.Servers {
		ups = append(ups, net.JoinHostPort(s, cc.Port))
	}
	r.upstreams, r.upMod = ups, fi.ModTime()
	return ups
}

// Set puts policy in force for guest's questions (it replaces the previous one; what was learned
// stays). host, the node's end of the guest's link, is not needed: a spoofed source never reaches
// the resolver, since the link's slot only redirects the guest's own address.
func (r *Resolver) Set(guestAddr, _ netip.Addr, policy egress.Policy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.guests[guestAddr.Unmap()]; ok {
		g.policy = policy
		return
	}
	r.guests[guestAddr.Unmap()] = &guest{policy: policy, learned: map[netip.Addr]learned{}}
}

// Remove forgets guest: its questions are refused.
func (r *Resolver) Remove(guestAddr netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.guests, guestAddr.Unmap())
}

func (r *Resolver) lookup(a netip.Addr) (*guest, egress.Policy, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	g, ok := r.guests[a.Unmap()]
	if !ok {
		return nil, egress.Policy{}, false
	}
	return g, g.policy, true
}

// NameOf returns the name guest learned addr for, if it is still remembered.
func (r *Resolver) NameOf(guestAddr, addr netip.Addr) (string, bool) {
	g, _, ok := r.lookup(guestAddr)
	if !ok {
		return "", false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	l, ok := g.learned[addr.Unmap()]
	if !ok || time.Now().After(l.expires) {
		delete(g.learned, addr.Unmap())
		return "", false
	}
	return l.name, true
}

// Serve answers on pc (UDP) and ln (TCP) until Close.
func (r *Resolver) Serve(pc net.PacketConn, ln net.Listener) {
	h := dns.HandlerFunc(r.serveDNS)
	r.servers = []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	for _, s := range r.servers {
		go func() { _ = s.ActivateAndServe() }()
	}
}

// Close stops serving.
func (r *Resolver) Close() {
	for _, s := range r.servers {
		_ = s.Shutdown()
	}
}

// Decide reports whether a question for name from a sandbox under policy p is forwarded: when the
// policy reaches any address anyway, or an allowOut domain covers the name.
func Decide(p egress.Policy, name string) bool {
	if p.ReachesAnyAddress() {
		return true
	}
	host, ok := egress.HostName(strings.TrimSuffix(name, "."))
	if !ok {
		return false
	}
	_, ok = p.MatchDomain(host)
	return ok
}

func (r *Resolver) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	g, policy, known := r.lookup(src.Addr())
	if !known {
		// Not a guest of this node (the port is bound on every address): no answer at all, so
		// the resolver can never be used to reflect traffic at a spoofed source.
		return
	}
	if req.Opcode != dns.OpcodeQuery {
		r.reply(w, req, dns.RcodeNotImplemented)
		return
	}
	if len(req.Question) != 1 {
		r.reply(w, req, dns.RcodeRefused)
		return
	}
	q := req.Question[0]
	if !Decide(policy, q.Name) {
		if r.cfg.OnRefuse != nil {
			r.cfg.OnRefuse(Refusal{Guest: src.Addr().Unmap(), Name: strings.TrimSuffix(strings.ToLower(q.Name), "."), Type: dns.TypeToString[q.Qtype]})
		}
		r.reply(w, req, dns.RcodeRefused)
		return
	}
	up, ok := Canonical(q)
	if !ok {
		r.reply(w, req, dns.RcodeRefused)
		return
	}
	resp, err := r.forward(up)
	if err != nil {
		r.log.Debug("egress resolver: upstream failed", "name", q.Name, "err", err)
		r.reply(w, req, dns.RcodeServerFailure)
		return
	}
	r.learn(g, resp)
	out := answer(req, resp)
	if _, udp := w.LocalAddr().(*net.UDPAddr); udp {
		// An answer fetched again over TCP may not fit the guest's UDP buffer: send what fits,
		// marked truncated, so the guest asks again over TCP.
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(size, int(o.UDPSize()))
		}
		out.Truncate(size)
	}
	if err := w.WriteMsg(out); err != nil {
		r.log.Debug("egress resolver: answer not sent", "name", q.Name, "err", err)
	}
}

// Canonical is the question sent upstream for a guest's question q: a message the resolver
// builds itself, so nothing but the name's letters, as a lower-case name, and a type from a short
// list reaches the outside. A fresh id, RD set and every other flag clear (no CD, no AD), class
// IN, the resolver's own EDNS record (no DO bit, no options) and no other section: the guest's
// id, 0x20 letter case, flags, EDNS options and extra records, any of which could carry data,
// never leave the node. ok is false for a class other than IN or a type not forwarded.
func Canonical(q dns.Question) (m *dns.Msg, ok bool) {
	if q.Qclass != dns.ClassINET || !forwardedTypes[q.Qtype] {
		return nil, false
	}
	m = &dns.Msg{MsgHdr: dns.MsgHdr{Id: dns.Id(), Opcode: dns.OpcodeQuery, RecursionDesired: true}}
	m.Question = []dns.Question{{Name: strings.ToLower(q.Name), Qtype: q.Qtype, Qclass: dns.ClassINET}}
	m.SetEdns0(upstreamUDPSize, false)
	return m, true
}

// answer is the upstream's answer given back under the guest's question as the guest asked it
// (its id, letter case and RD/CD bits; stub resolvers check the question, some its case): the
// records of the upstream answer, the owner names equal to the question restored to the guest's
// case, and the upstream's EDNS record replaced by the resolver's own when the guest used EDNS.
func answer(req, resp *dns.Msg) *dns.Msg {
	out := new(dns.Msg)
	out.SetReply(req)
	out.Rcode = resp.Rcode
	out.RecursionAvailable = resp.RecursionAvailable
	asked := req.Question[0].Name
	for _, rr := range resp.Answer {
		if h := rr.Header(); strings.EqualFold(h.Name, asked) {
			h.Name = asked
		}
	}
	out.Answer, out.Ns = resp.Answer, resp.Ns
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			out.Extra = append(out.Extra, rr)
		}
	}
	if req.IsEdns0() != nil {
		out.SetEdns0(upstreamUDPSize, false)
	} else if out.Rcode > 0xF {
		// An extended code cannot be said without EDNS.
		out.Rcode = dns.RcodeServerFailure
	}
	return out
}

// forward asks the upstreams in turn over UDP, whatever the guest used; a truncated answer is
// asked again over TCP, and a server that rejects EDNS (FORMERR) is asked again without it. An
// answer must be for the question asked.
func (r *Resolver) forward(req *dns.Msg) (*dns.Msg, error) {
	ups := r.currentUpstreams()
	if len(ups) == 0 {
		return nil, errors.New("the node has no resolver to forward to")
	}
	var errs []error
	for _, up := range ups {
		resp, err := r.exchange(req, up)
		if err == nil && resp.Rcode == dns.RcodeFormatError && req.IsEdns0() != nil {
			plain := req.Copy()
			plain.Extra = nil
			plain.Id = dns.Id()
			resp, err = r.exchange(plain, up)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (r *Resolver) exchange(req *dns.Msg, up string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: r.cfg.Timeout, UDPSize: upstreamUDPSize}
	resp, _, err := c.Exchange(req, up)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.Exchange(req, up)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", up, err)
	}
	if q, a := req.Question[0], resp.Question; len(a) != 1 || !strings.EqualFold(a[0].Name, q.Name) || a[0].Qtype != q.Qtype || a[0].Qclass != q.Qclass {
		return nil, fmt.Errorf("%s: answered another question: %v", up, resp.Question)
	}
	return resp, nil
}

// learn remembers the addresses an answer holds, for the question's name.
func (r *Resolver) learn(g *guest, resp *dns.Msg) {
	if len(resp.Question) == 0 {
		return
	}
	name := strings.TrimSuffix(strings.ToLower(resp.Question[0].Name), ".")
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rr := range resp.Answer {
		var a netip.Addr
		switch v := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(v.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(v.AAAA)
		default:
			continue
		}
		ttl := min(max(time.Duration(rr.Header().Ttl)*time.Second, MinTTL), MaxTTL)
		if len(g.learned) >= maxLearned {
			for k, l := range g.learned {
				if now.After(l.expires) {
					delete(g.learned, k)
				}
			}
			if len(g.learned) >= maxLearned {
				continue
			}
		}
		g.learned[a.Unmap()] = learned{name: name, expires: now.Add(ttl)}
	}
}

func (r *Resolver) reply(w dns.ResponseWriter, req *dns.Msg, rcode int) {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	_ = w.WriteMsg(m)
}

// ListenAndServe opens UDP and TCP on addr in the caller's namespace and serves them; stop closes
// both.
func (r *Resolver) ListenAndServe(addr string) (stop func(), err error) {
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("egress resolver: %w", err)
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("egress resolver: %w", err)
	}
	r.Serve(pc, ln)
	return func() {
		r.Close()
		pc.Close()
		ln.Close()
	}, nil
}
