package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// What batching relies on, checked against the host's own iptables-restore (nf_tables or legacy,
// whichever it selects): each script's COMMIT applies it before the next is read, a refused line
// is named by its number, and nothing after it is applied.
func TestKernelBatchRefusedLine(t *testing.T) {
	node := netnstest.New(t, "batch")
	run, err := newRunner(node.Path, DefaultTools)
	if err != nil {
		t.Fatal(err)
	}
	b := &batcher{run: run, f: v4}
	chain := func(name string) string {
		return fmt.Sprintf("*filter\n:%s - [0:0]\n-A %s -j DROP\nCOMMIT\n", name, name)
	}
	for i, bad := range []string{
		// Refused when sent to the kernel (nf_tables names the COMMIT).
		"*filter\n:VMONT-B - [0:0]\n-A VMONT-B -j VMONT-NOSUCH\nCOMMIT\n",
		// Refused as it is read.
		"*filter\n:VMONT-B - [0:0]\n-A VMONT-NOSUCH -j DROP\nCOMMIT\n",
	} {
		before, after := fmt.Sprintf("VMONT-A%d", i), fmt.Sprintf("VMONT-C%d", i)
		batch := []*queued{{script: chain(before)}, {script: bad}, {script: chain(after)}}
		for _, q := range batch {
			q.done = make(chan error, 1)
		}
		rest := b.apply(batch)
		if err := <-batch[0].done; err != nil {
			t.Fatalf("the script before the refused one: %v", err)
		}
		err := <-batch[1].done
		var re *restoreError
		// The rule's line, or the COMMIT that sent it to the kernel.
		if !errors.As(err, &re) || re.script != bad || !regexp.MustCompile(`line [34] of this transaction`).MatchString(err.Error()) {
			t.Fatalf("the refused script got %v", err)
		}
		if len(rest) != 1 || rest[0] != batch[2] {
			t.Fatalf("the script after the refused one is not sent back: %d", len(rest))
		}
		save := node.MustRun("", "iptables-save", "-t", "filter")
		if !strings.Contains(save, "-A "+before+" -j DROP") {
			t.Errorf("the script before the refused one was not applied:\n%s", save)
		}
		if strings.Contains(save, after) {
			t.Errorf("the script after the refused one was applied:\n%s", save)
		}
	}
}

// countingRunner counts restores and the most that ran at once.
type countingRunner struct {
	runner
	n, now, peak atomic.Int32
}

func (c *countingRunner) restore(ctx context.Context, f family, s string) error {
	c.n.Add(1)
	now := c.now.Add(1)
	defer c.now.Add(-1)
	for p := c.peak.Load(); now > p && !c.peak.CompareAndSwap(p, now); p = c.peak.Load() {
	}
	return c.runner.restore(ctx, f, s)
}

// countingFirewall is a firewall over the host's iptables in node whose restores are counted.
func countingFirewall(tb testing.TB, node *netnstest.NS) (*Firewall, *countingRunner) {
	tb.Helper()
	run, err := newRunner(node.Path, DefaultTools)
	if err != nil {
		tb.Fatal(err)
	}
	cr := &countingRunner{runner: run}
	fw := newFirewall(testNames(tb), egress.NewEnv(nil), cr, slog.New(slog.DiscardHandler))
	tb.Cleanup(fw.Close)
	return fw, cr
}

// attachedLinks installs links 0..n-1 and attaches pol to each, compactions done.
func attachedLinks(tb testing.TB, fw *Firewall, n int, pol egress.Policy) []*Hooks {
	tb.Helper()
	ctx := context.Background()
	hooks := make([]*Hooks, n)
	for i := range hooks {
		h, err := fw.Install(ctx, Link{Index: i, Guest: leaseGuest(i), Pool: testPool})
		if err != nil {
			tb.Fatal(err)
		}
		if err := h.Attach(ctx, pol); err != nil {
			tb.Fatal(err)
		}
		hooks[i] = h
	}
	fw.wg.Wait()
	return hooks
}

// Many links detached at once (a node killing its sandboxes) take far fewer iptables-restores
// than links, never more than one per family at a time, and every chain ends up closed.
func TestKernelConcurrentDetach(t *testing.T) {
	ctx := context.Background()
	node := netnstest.New(t, "burst")
	fw, cr := countingFirewall(t, node)
	n := fw.names
	const links = 60
	hooks := attachedLinks(t, fw, links, egress.Policy{AllowOut: pfx("203.0.113.0/24"), DenyOut: pfx("0.0.0.0/0", "::/0")})
	cr.n.Store(0)
	cr.peak.Store(0)
	var wg sync.WaitGroup
	errs := make([]error, links)
	for i, h := range hooks {
		wg.Go(func() { errs[i] = h.Detach(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := cr.n.Load(); got >= links {
		t.Errorf("%d restores for %d detaches of %d links in each family: not batched", got, 2*links, links)
	}
	if p := cr.peak.Load(); p > int32(len(families)) {
		t.Errorf("%d restores ran at once, want at most one per family", p)
	}
	t.Logf("%d detaches in %d restores", 2*links, cr.n.Load())
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		save := node.MustRun("", bin, "-t", "filter")
		for i := range links {
			chain := n.chainName(chainEgress, i)
			got := regexp.MustCompile(`(?m)^-A `+chain+` .*$`).FindAllString(save, -1)
			if len(got) != 1 || got[0] != "-A "+chain+" -j DROP" {
				t.Errorf("%s: %s is not closed: %q", bin, chain, got)
			}
		}
	}
}
