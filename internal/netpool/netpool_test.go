package netpool

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

func TestParsePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"":               "172.20.0.0/16",
		"172.20.0.0/16":  "172.20.0.0/16",
		"10.0.0.0/8":     "10.0.0.0/8",
		"192.168.4.0/30": "192.168.4.0/30",
	} {
		got, err := ParsePrefix(in)
		if err != nil || got.String() != want {
			t.Errorf("ParsePrefix(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"172.20.0.1/16": "host bits are set (the network is 172.20.0.0/16)",
		"10.0.0.0/7":    "between /8 and /30",
		"10.0.0.0/31":   "between /8 and /30",
		"fd00::/64":     "must be an IPv4 prefix",
		"172.20.0.0":    "not a CIDR prefix",
		"nonsense":      "not a CIDR prefix",
	} {
		_, err := ParsePrefix(in)
		if !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParsePrefix(%q) = %v, want an invalid-argument error containing %q", in, err, msg)
		}
	}
}

func TestLeases(t *testing.T) {
	pool := netip.MustParsePrefix("172.20.0.0/16")
	if n := Leases(pool); n != 16384 {
		t.Errorf("a /16 holds %d leases, want 16384 (seed)", n)
	}
	l, err := LeaseAt(pool, 7)
	if err != nil {
		t.Fatal(err)
	}
	if l.Network.String() != "172.20.0.28/30" || l.Host.String() != "172.20.0.29" ||
		l.Guest.String() != "172.20.0.30" || l.Mark() != 8 || l.GuestPrefix().String() != "172.20.0.30/30" {
		t.Errorf("lease 7 = %+v mark %d", l, l.Mark())
	}
	if l, _ := LeaseAt(pool, 16383); l.Guest.String() != "172.20.255.254" {
		t.Errorf("last lease = %+v", l)
	}
	if _, err := LeaseAt(pool, 16384); err == nil {
		t.Error("lease past the end of the pool")
	}
	if n := Leases(netip.MustParsePrefix("10.0.0.0/30")); n != 1 {
		t.Errorf("a /30 holds %d leases", n)
	}
}

func TestAllocatorRoundRobin(t *testing.T) {
	a := newAllocator(4)
	var got []int
	for range 3 {
		i, _ := a.alloc()
		got = append(got, i)
	}
	a.free(0) // released early, but reused only after 3 was handed out
	for range 2 {
		i, _ := a.alloc()
		got = append(got, i)
	}
	if _, ok := a.alloc(); ok {
		t.Error("allocated from a full pool")
	}
	if !slices.Equal(got, []int{0, 1, 2, 3, 0}) {
		t.Errorf("allocation order = %v", got)
	}
	a.free(2)
	a.free(1)
	if i, _ := a.alloc(); i != 1 {
		t.Errorf("after 0, the cursor continues at 1; got %d", i)
	}
}

// fakeSystem is the OS side for pool logic tests.
type fakeSystem struct {
	mu        sync.Mutex
	links     map[int]bool // device exists
	resets    []int
	destroyed []int
	failNext  error
	createDur time.Duration
	// resetGate, when set, holds every reset until it is closed.
	resetGate chan struct{}
}

type fakeHooks struct{ attached bool }

func (h *fakeHooks) Attach(context.Context, egress.Policy) error { h.attached = true; return nil }
func (h *fakeHooks) Update(context.Context, egress.Policy) error { return nil }
func (h *fakeHooks) Detach(context.Context) error                { h.attached = false; return nil }

func (f *fakeSystem) create(_ context.Context, lease Lease, unrestricted bool) (*Link, error) {
	time.Sleep(f.createDur)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return nil, err
	}
	f.links[lease.Index] = true
	l := &Link{lease: lease, name: names{link: "vmon"}.linkName(lease.Index), unrestricted: unrestricted}
	if !unrestricted {
		l.hooks = &fakeHooks{}
	}
	return l, nil
}

func (f *fakeSystem) adopt(_ context.Context, lease Lease) (*Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.links[lease.Index] {
		return nil, errdefs.NotFound("gone")
	}
	return &Link{lease: lease, hooks: &fakeHooks{}}, nil
}

func (f *fakeSystem) prepare(context.Context, *Link) error { return nil }

func (f *fakeSystem) reset(_ context.Context, l *Link) error {
	f.mu.Lock()
	gate := f.resetGate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets = append(f.resets, l.lease.Index)
	return l.hooks.Detach(context.Background())
}

func (f *fakeSystem) destroy(_ context.Context, i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, i)
	f.destroyed = append(f.destroyed, i)
	return nil
}

func (f *fakeSystem) existing(context.Context) ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for i := range f.links {
		out = append(out, i)
	}
	return out, nil
}

func (f *fakeSystem) sweep(context.Context, func(int) bool) error { return nil }
func (f *fakeSystem) close(context.Context, bool) error           { return nil }

func newFakePool(t *testing.T, target int) (*Pool, *fakeSystem) {
	t.Helper()
	cfg, err := Config{Target: target, Prefix: netip.MustParsePrefix("172.20.0.0/26")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	sys := &fakeSystem{links: map[int]bool{}}
	p := newPool(cfg, sys)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, sys
}

func waitReady(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Ready != n {
		if time.Now().After(deadline) {
			t.Fatalf("ready = %d, want %d", p.Stats().Ready, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Target 0 is the ready pool turned off: nothing is pre-created, every take builds a link and
// every release tears it down.
func TestPoolWithoutReadyLinks(t *testing.T) {
	ctx := context.Background()
	p, sys := newFakePool(t, 0)
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // a refill, were one running, would have started by now
	if s := p.Stats(); s.Ready != 0 || s.Target != 0 {
		t.Fatalf("stats of a pool without ready links: %+v", s)
	}
	for i := range 3 {
		l, err := p.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s := p.Stats(); s.Misses != i+1 || s.Ready != 0 || s.InUse != 1 {
			t.Fatalf("take %d: %+v", i, s)
		}
		if err := p.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		sys.mu.Lock()
		left := len(sys.links)
		sys.mu.Unlock()
		if s := p.Stats(); s.Ready != 0 || s.InUse != 0 || s.Destroyed != i+1 || left != 0 {
			t.Fatalf("release %d: %+v, %d links left", i, s, left)
		}
	}
}

func TestPoolLifecycle(t *testing.T) {
	ctx := context.Background()
	p, sys := newFakePool(t, 2)
	if _, err := p.Take(ctx); !errdefs.Is(err, errdefs.KindUnavailable) {
		t.Fatalf("take before recover: %v", err)
	}
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 2)

	a, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Misses != 0 || s.InUse != 1 {
		t.Errorf("stats after a take from the ready pool: %+v", s)
	}
	waitReady(t, p, 2) // refilled
	if err := p.Attach(ctx, a, egress.Policy{}); err != nil || !a.hooks.(*fakeHooks).attached {
		t.Fatalf("attach: %v", err)
	}

	// Release returns links to the pool until it holds twice its target; the rest are torn down.
	var taken []*Link
	for range 3 {
		l, err := p.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, l)
	}
	// a (attached) first, so it goes back to the pool and must come back detached.
	taken = append([]*Link{a}, taken...)
	waitReady(t, p, 2)
	for _, l := range taken {
		if err := p.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Ready != 4 || s.InUse != 0 || s.Destroyed != 2 {
		t.Errorf("after releasing 4 into a pool of 2 ready (target 2): %+v", s)
	}
	if a.hooks.(*fakeHooks).attached {
		t.Error("release left the policy attached")
	}
	if err := p.Release(ctx, a); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("double release: %v", err)
	}
	// The two that went back were reset (policy chains closed); the two torn down were not reset
	// first: an iptables transaction for a link about to be deleted is wasted.
	sys.mu.Lock()
	resets := slices.Clone(sys.resets)
	sys.mu.Unlock()
	want := []int{taken[0].lease.Index, taken[1].lease.Index}
	slices.Sort(resets)
	slices.Sort(want)
	if !slices.Equal(resets, want) {
		t.Errorf("reset links %v, want %v (those returned to the pool)", resets, want)
	}

	// Template links have no hooks and are never pooled.
	b, err := p.TakeUnrestricted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Attach(ctx, b, egress.Policy{}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Errorf("attach to a template link: %v", err)
	}
	before := p.Stats().Destroyed
	if err := p.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Destroyed != before+1 {
		t.Error("template link was not torn down")
	}

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	sys.mu.Lock()
	left := len(sys.links)
	sys.mu.Unlock()
	if left != 0 {
		t.Errorf("%d links left after close", left)
	}
	if _, err := p.Take(ctx); !errdefs.Is(err, errdefs.KindUnavailable) {
		t.Errorf("take after close: %v", err)
	}
}

func TestPoolEmptyTakeCreates(t *testing.T) {
	ctx := context.Background()
	p, sys := newFakePool(t, 1)
	sys.createDur = 20 * time.Millisecond
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// The refill has not finished: the take creates its own link.
	if _, err := p.Take(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Take(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Misses == 0 {
		t.Errorf("stats = %+v, want misses", s)
	}
}

func TestPoolExhaustion(t *testing.T) {
	ctx := context.Background()
	cfg, _ := Config{Target: 1, Prefix: netip.MustParsePrefix("172.20.0.0/29")}.withDefaults()
	sys := &fakeSystem{links: map[int]bool{}}
	p := newPool(cfg, sys)
	defer p.Close(ctx)
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 3 {
		if _, err = p.Take(ctx); err != nil {
			break
		}
	}
	if !errdefs.Is(err, errdefs.KindResourceExhausted) {
		t.Errorf("third take from a pool of 2 leases: %v", err)
	}
}

// A release in the background keeps its lease until the link is reset; a Take that finds every
// lease taken waits for it (or for its context) instead of failing, and Close waits for it too.
func TestPoolReleaseLater(t *testing.T) {
	ctx := context.Background()
	cfg, _ := Config{Target: 1, Prefix: netip.MustParsePrefix("172.20.0.0/29")}.withDefaults()
	sys := &fakeSystem{links: map[int]bool{}, resetGate: make(chan struct{})}
	p := newPool(cfg, sys)
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	a, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Take(ctx); err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	go func() { p.ReleaseLater(a); close(returned) }()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("ReleaseLater waited for the reset")
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.Take(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take while the only release is held: %v, want the context's deadline", err)
	}

	got := make(chan *Link, 1)
	go func() {
		l, err := p.Take(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case l := <-got:
		t.Fatalf("take returned link %v before the release finished", l)
	case <-time.After(50 * time.Millisecond):
	}
	close(sys.resetGate)
	select {
	case l := <-got:
		if l == nil || l.ID() != a.ID() {
			t.Fatalf("take after the release = %v, want link %d", l, a.ID())
		}
		if l.hooks.(*fakeHooks).attached {
			t.Error("the released link came back attached")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("take did not wake up when the release finished")
	}

	// Close waits for a release in flight; the link is then torn down, not pooled.
	sys.mu.Lock()
	sys.resetGate = make(chan struct{})
	gate := sys.resetGate
	sys.mu.Unlock()
	if l, err := p.Take(ctx); !errdefs.Is(err, errdefs.KindResourceExhausted) {
		t.Fatalf("take with both leases in use and none releasing = %v, %v; want exhausted at once", l, err)
	}
	p.ReleaseLater(a)
	for p.Stats().InUse != 1 { // the release is now held in its reset
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close(ctx) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a release was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if sys.links[a.lease.Index] {
		t.Errorf("link %d survived Close", a.ID())
	}
}

func TestPoolRecover(t *testing.T) {
	ctx := context.Background()
	p, sys := newFakePool(t, 1)
	// What a crash left: links 1 and 3 (held by sandboxes that came back), 2 and 5 (idle).
	for _, i := range []int{1, 2, 3, 5} {
		sys.links[i] = true
	}
	got, err := p.Recover(ctx, []LinkID{1, 3, 4})
	if err == nil || !strings.Contains(err.Error(), "recover link 4") {
		t.Errorf("recovering a vanished link: %v", err)
	}
	if len(got) != 2 || got[1] == nil || got[3] == nil {
		t.Fatalf("recovered %v", got)
	}
	sys.mu.Lock()
	destroyed := slices.Clone(sys.destroyed)
	sys.mu.Unlock()
	slices.Sort(destroyed)
	if !slices.Equal(destroyed, []int{2, 5}) {
		t.Errorf("destroyed %v, want the idle links [2 5]", destroyed)
	}
	if _, err := p.Recover(ctx, nil); !errdefs.Is(err, errdefs.KindConflict) {
		t.Errorf("second recover: %v", err)
	}
	waitReady(t, p, 1)
	// Recovered links are in use: new links never get their leases.
	for _, id := range p.readyIDs() {
		if id == 1 || id == 3 {
			t.Errorf("ready link %d reuses a recovered lease", id)
		}
	}
	if err := p.Release(ctx, got[1]); err != nil {
		t.Fatal(err)
	}
}

func TestPoolRefillBacksOff(t *testing.T) {
	ctx := context.Background()
	p, sys := newFakePool(t, 1)
	sys.failNext = errors.New("boom")
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 1) // retried after the failure
}

func TestNamespaceNamesAreScoped(t *testing.T) {
	scoped, plain := names{link: "vmon", scope: "ab12cd"}, names{link: "vmon"}
	if got := scoped.nsName(3); got != "vmon-net-ab12cd-3" {
		t.Fatalf("scoped name %q", got)
	}
	if got := plain.nsName(3); got != "vmon-net-3" {
		t.Fatalf("plain name %q", got)
	}
	// Neither node reads the other's namespaces as its own.
	if _, ok := strings.CutPrefix(scoped.nsName(3), plain.nsPrefix()); ok {
		if _, err := strconv.Atoi(strings.TrimPrefix(scoped.nsName(3), plain.nsPrefix())); err == nil {
			t.Fatal("an unscoped node would take a scoped namespace for its own")
		}
	}
	if strings.HasPrefix(plain.nsName(3), scoped.nsPrefix()) {
		t.Fatal("a scoped node would take an unscoped namespace for its own")
	}
}
