package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// BenchmarkAttachUpdate measures attach and live-update latency with 1, 100 and 500 attached
// links in one namespace (target: ≤ 10 ms and flat). Links are added cumulatively, each attached
// to a typical deny-all + allowOut policy with two domains on a node running the egress proxy,
// the filtering resolver and refusal logging, so the tables hold what 500 running sandboxes
// would, proxy slots included. Besides ns/op it reports p50 and p99 in milliseconds.
//
//	go test ./internal/firewall -run '^$' -bench AttachUpdate -benchtime 50x
func BenchmarkAttachUpdate(b *testing.B) {
	ctx := context.Background()
	node := netnstest.New(b, "bench")
	fw, err := New(Config{Env: egress.NewEnv(nil), NetNS: node.Path, ProxyPort: benchProxyPort, DNSPort: benchDNSPort, LogGroup: benchLogGroup})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fw.Close)
	typical := egress.Policy{
		AllowOut:     pfx("203.0.113.0/24", "198.51.100.7/32", "2001:db8:a::/48", "8.8.8.8/32"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"pypi.org", "*.pythonhosted.org"},
	}
	open := egress.Policy{}
	var hooks []*Hooks
	for _, n := range []int{1, 100, 500} {
		start := time.Now()
		for len(hooks) < n {
			i := len(hooks)
			l := Link{Index: i, Guest: leaseGuest(i), Pool: testPool}
			h, err := fw.Install(ctx, l)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Attach(ctx, typical); err != nil {
				b.Fatal(err)
			}
			hooks = append(hooks, h)
		}
		fw.wg.Wait()
		b.Logf("%d links installed and attached in %v", n, time.Since(start).Round(time.Millisecond))
		// The measured link is the newest, i.e. its rules sit at the top of the built-in chains.
		h := hooks[len(hooks)-1]
		b.Run(fmt.Sprintf("links=%d/attach", n), func(b *testing.B) {
			var d []time.Duration
			for b.Loop() {
				b.StopTimer()
				if err := h.Detach(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t0 := time.Now()
				if err := h.Attach(ctx, typical); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
			}
			report(b, d)
		})
		b.Run(fmt.Sprintf("links=%d/update", n), func(b *testing.B) {
			var d []time.Duration
			i := 0
			for b.Loop() {
				p := typical
				if i%2 == 0 {
					p = open
				}
				i++
				t0 := time.Now()
				if err := h.Update(ctx, p); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
				// Let the background compaction run outside the measurement, as it would
				// between two updates of one sandbox.
				b.StopTimer()
				fw.wg.Wait()
				b.StartTimer()
			}
			report(b, d)
		})
	}
}

func leaseGuest(i int) netip.Addr {
	a := testPool.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i)*4 + 2
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func report(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
	b.ReportMetric(ms(d[len(d)/2]), "p50-ms")
	b.ReportMetric(ms(d[(len(d)*99)/100]), "p99-ms")
}

// The node features the attach benchmark runs with; the variables let one run compare them
// (VMON_BENCH_FW_PLAIN=1 turns the proxy slot, the resolver and refusal logging off).
var benchProxyPort, benchDNSPort, benchLogGroup uint16 = 15380, 15353, 5380

func init() {
	if os.Getenv("VMON_BENCH_FW_PLAIN") == "1" {
		benchProxyPort, benchDNSPort, benchLogGroup = 0, 0, 0
	}
	if os.Getenv("VMON_BENCH_FW_NOLOG") == "1" {
		benchLogGroup = 0
	}
}

// BenchmarkDetachBurst measures what a node killing many sandboxes at once costs the firewall:
// with 500 links attached, 100 of them are detached at once (as their sandboxes' links are
// released) and the burst's wall time is reported, with the iptables-restore processes it took.
//
//	go test ./internal/firewall -run '^$' -bench DetachBurst -benchtime 5x
func BenchmarkDetachBurst(b *testing.B) {
	ctx := context.Background()
	node := netnstest.New(b, "burst")
	fw, cr := countingFirewall(b, node)
	fw.proxyPort, fw.dnsPort, fw.logGroup = benchProxyPort, benchDNSPort, benchLogGroup
	typical := egress.Policy{
		AllowOut:     pfx("203.0.113.0/24", "198.51.100.7/32", "2001:db8:a::/48", "8.8.8.8/32"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"pypi.org", "*.pythonhosted.org"},
	}
	const links, burst = 500, 100
	hooks := attachedLinks(b, fw, links, typical)
	var restores int32
	for b.Loop() {
		cr.n.Store(0)
		var wg sync.WaitGroup
		for _, h := range hooks[:burst] {
			wg.Go(func() {
				if err := h.Detach(ctx); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		restores += cr.n.Load()
		b.StopTimer()
		for _, h := range hooks[:burst] {
			if err := h.Attach(ctx, typical); err != nil {
				b.Fatal(err)
			}
		}
		fw.wg.Wait()
		b.StartTimer()
	}
	b.ReportMetric(float64(restores)/float64(b.N), "restores/burst")
}
