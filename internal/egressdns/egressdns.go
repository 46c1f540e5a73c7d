// Package egressdns owns the node's filtering resolver (--egress-dns filter, seed 002 "Names"):
// guest DNS that a link's proxy slot redirected (UDP and TCP 53, to whatever server the guest
// asked) is answered here. A question only the sandbox's allowOut domains cover is forwarded to
// the node's own resolvers; any other is REFUSED, so a sandbox under deny-all cannot carry data
// out in query names. Answers' A and AAAA addresses are remembered per sandbox with their TTL
// clamped to 30 s–1 h, which names the destinations of later refusals. The package never touches
// iptables or links (firewall and netpool redirect to it) and never answers from anywhere but the
// upstream it forwards to.
package egressdns

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
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
)

// Refusal is a refused question, for the stream of what was blocked.
type Refusal struct {
	Guest netip.Addr
	Name  string
	Type  string
}

// Config configures a Resolver.
type Config struct {
	// Upstreams are the servers questions are forwarded to (host:port); empty reads
	// /etc/resolv.conf.
	Upstreams []string
	// OnRefuse, when set, is called for every refused question.
	OnRefuse func(Refusal)
	// Timeout bounds one upstream exchange (default 5 s).
	Timeout time.Duration
	Log     *slog.Logger
}

// Resolver is the node's filtering resolver.
type Resolver struct {
	cfg       Config
	log       *slog.Logger
	upstreams []string

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
	ups := cfg.Upstreams
	if len(ups) == 0 {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("egress resolver: read the node's resolvers: %w", err)
		}
		for _, s := range cc.Servers {
			ups = append(ups, net.JoinHostPort(s, cc.Port))
		}
	}
	if len(ups) == 0 {
		return nil, errors.New("egress resolver: the node has no resolver to forward to")
	}
	return &Resolver{cfg: cfg, log: cfg.Log, upstreams: ups, guests: map[netip.Addr]*guest{}}, nil
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
	resp, err := r.forward(req)
	if err != nil {
		r.log.Debug("egress resolver: upstream failed", "name", q.Name, "err", err)
		r.reply(w, req, dns.RcodeServerFailure)
		return
	}
	r.learn(g, resp)
	resp.Id = req.Id
	if _, udp := w.LocalAddr().(*net.UDPAddr); udp {
		// An answer fetched again over TCP may not fit the guest's UDP buffer: send what fits,
		// marked truncated, so the guest asks again over TCP.
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(size, int(o.UDPSize()))
		}
		resp.Truncate(size)
	}
	if err := w.WriteMsg(resp); err != nil {
		r.log.Debug("egress resolver: answer not sent", "name", q.Name, "err", err)
	}
}

// forward asks the upstreams in turn over UDP, whatever the guest used; a truncated answer is
// asked again over TCP.
func (r *Resolver) forward(req *dns.Msg) (*dns.Msg, error) {
	var errs []error
	for _, up := range r.upstreams {
		c := &dns.Client{Net: "udp", Timeout: r.cfg.Timeout}
		resp, _, err := c.Exchange(req, up)
		if err == nil && resp.Truncated {
			c.Net = "tcp"
			resp, _, err = c.Exchange(req, up)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
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
