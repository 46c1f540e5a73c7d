package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gateRunner holds every restore until the test lets it go, and refuses the line refuse returns
// (0: none) the way iptables-restore does.
type gateRunner struct {
	mu     sync.Mutex
	calls  []string
	gate   chan struct{}
	refuse func(script string) int
	fail   error
}

func (r *gateRunner) restore(_ context.Context, _ family, s string) error {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
	<-r.gate
	if r.fail != nil {
		return &restoreError{bin: "iptables-restore", err: r.fail, script: s}
	}
	if r.refuse != nil {
		if n := r.refuse(s); n > 0 {
			return &restoreError{bin: "iptables-restore", err: fmt.Errorf("exit status 1: iptables-restore: line %d failed", n), script: s}
		}
	}
	return nil
}

func (r *gateRunner) save(context.Context, family) (string, error) { return "", nil }

func (r *gateRunner) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *gateRunner) call(i int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[i]
}

func txn(name string) string {
	return fmt.Sprintf("*filter\n-F %s\n-A %s -j DROP\nCOMMIT\n", name, name)
}

// startQueued starts one restore per name, in order, while the first holds the runner.
func startQueued(t *testing.T, b *batcher, r *gateRunner, names ...string) []chan error {
	t.Helper()
	out := make([]chan error, len(names))
	for i, n := range names {
		out[i] = make(chan error, 1)
		go func() { out[i] <- b.restore(context.Background(), txn(n)) }()
		if i == 0 {
			waitCalls(t, r, 1)
		} else {
			waitQueued(t, b, i)
		}
	}
	return out
}

func waitQueued(t *testing.T, b *batcher, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		q := len(b.queue)
		b.mu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitCalls(t *testing.T, r *gateRunner, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.callCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d restores, want %d", r.callCount(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func results(t *testing.T, chs []chan error) []error {
	t.Helper()
	out := make([]error, len(chs))
	for i, ch := range chs {
		select {
		case out[i] = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("restore %d never returned", i)
		}
	}
	return out
}

// Transactions that arrive while one runs are applied together by the next iptables-restore, in
// the order they came.
func TestBatchCoalesces(t *testing.T) {
	r := &gateRunner{gate: make(chan struct{})}
	b := &batcher{run: r, f: v4}
	chs := startQueued(t, b, r, "A", "B", "C", "D")
	if n := r.callCount(); n != 1 {
		t.Fatalf("%d restores while the first runs, want 1", n)
	}
	close(r.gate)
	for i, err := range results(t, chs) {
		if err != nil {
			t.Errorf("restore %d: %v", i, err)
		}
	}
	if n := r.callCount(); n != 2 {
		t.Fatalf("%d restores, want 2 (the first alone, the three queued behind it together)", n)
	}
	if got, want := r.call(1), txn("B")+txn("C")+txn("D"); got != want {
		t.Fatalf("second restore:\n%s\nwant\n%s", got, want)
	}
}

// A refused line fails the transaction holding it, with the line counted within that
// transaction; those before it stand, and those after it run again in the next batch.
func TestBatchRefusedLine(t *testing.T) {
	r := &gateRunner{gate: make(chan struct{})}
	r.refuse = func(s string) int {
		// C's rule is the one the kernel refuses, wherever it sits.
		for i, l := range strings.Split(s, "\n") {
			if l == "-A C -j DROP" {
				return i + 1
			}
		}
		return 0
	}
	b := &batcher{run: r, f: v4}
	chs := startQueued(t, b, r, "A", "B", "C", "D", "E")
	close(r.gate)
	errs := results(t, chs)
	for i, err := range errs {
		if (err != nil) != (i == 3-1) {
			t.Errorf("restore %d (%s): %v", i, "ABCDE"[i:i+1], err)
		}
	}
	var re *restoreError
	if !errors.As(errs[2], &re) {
		t.Fatalf("C failed with %T %v, want a restoreError", errs[2], errs[2])
	}
	if re.script != txn("C") || !strings.Contains(re.Error(), "line 3 of this transaction") {
		t.Fatalf("C's error names the batch, not its own transaction: %v", re)
	}
	// A alone, then B+C+D+E (refused at C), then D+E again.
	if n := r.callCount(); n != 3 {
		t.Fatalf("%d restores, want 3", n)
	}
	if got, want := r.call(2), txn("D")+txn("E"); got != want {
		t.Fatalf("third restore:\n%s\nwant\n%s", got, want)
	}
}

// An error that names no line (iptables-restore could not run) fails every transaction of the
// batch: none is known to be applied.
func TestBatchFailsWhole(t *testing.T) {
	r := &gateRunner{gate: make(chan struct{}), fail: errors.New("exec: not found")}
	b := &batcher{run: r, f: v4}
	chs := startQueued(t, b, r, "A", "B", "C")
	close(r.gate)
	for i, err := range results(t, chs) {
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("restore %d: %v", i, err)
		}
	}
}

// A waiter whose context ends stops waiting; the batch it joined still runs, and the worker does
// not block on the waiter that left.
func TestBatchWaiterLeaves(t *testing.T) {
	r := &gateRunner{gate: make(chan struct{})}
	b := &batcher{run: r, f: v4}
	first := make(chan error, 1)
	go func() { first <- b.restore(context.Background(), txn("A")) }()
	waitCalls(t, r, 1)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { left <- b.restore(ctx, txn("B")) }()
	waitQueued(t, b, 1)
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that left got %v", err)
	}
	close(r.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	waitCalls(t, r, 2)
	if got := r.call(1); got != txn("B") {
		t.Fatalf("the transaction of the waiter that left was not applied: %q", got)
	}
	// The worker is free again: a new transaction runs.
	if err := b.restore(context.Background(), txn("C")); err != nil {
		t.Fatal(err)
	}
}

// No more than maxBatch transactions go in one restore.
func TestBatchBounded(t *testing.T) {
	r := &gateRunner{gate: make(chan struct{})}
	b := &batcher{run: r, f: v4}
	names := make([]string, maxBatch+6)
	for i := range names {
		names[i] = fmt.Sprintf("L%d", i)
	}
	chs := startQueued(t, b, r, names...)
	close(r.gate)
	for i, err := range results(t, chs) {
		if err != nil {
			t.Errorf("restore %d: %v", i, err)
		}
	}
	if n := r.callCount(); n != 3 {
		t.Fatalf("%d restores, want 3 (1, %d, 5)", n, maxBatch)
	}
	if got := strings.Count(r.call(1), "COMMIT"); got != maxBatch {
		t.Fatalf("second restore holds %d transactions, want %d", got, maxBatch)
	}
}

// gateSave holds every save until the test lets it go, and counts them.
type gateSave struct {
	fakeRunner
	gate  chan struct{}
	saves atomic.Int32
}

func (r *gateSave) save(ctx context.Context, f family) (string, error) {
	r.saves.Add(1)
	<-r.gate
	return r.fakeRunner.save(ctx, f)
}

// Removals that queue while one runs are done together: one read of the tables and one delete
// per family for all of them.
func TestRemoveCoalesces(t *testing.T) {
	r := &gateSave{gate: make(chan struct{})}
	r.saved = savedSample
	fw := newFirewall(testNames(t), defaultEnv, r, slog.New(slog.DiscardHandler))
	t.Cleanup(fw.Close)
	first := make(chan error, 1)
	go func() { first <- fw.Remove(context.Background(), 7) }()
	for r.saves.Load() < int32(len(families)) {
		time.Sleep(time.Millisecond)
	}
	var queued [3]chan error
	for i := range queued {
		queued[i] = make(chan error, 1)
		go func() { queued[i] <- fw.Remove(context.Background(), 9) }()
	}
	for {
		fw.removing.mu.Lock()
		n := len(fw.removing.pending[9])
		fw.removing.mu.Unlock()
		if n == len(queued) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(r.gate)
	for _, ch := range append([]chan error{first}, queued[:]...) {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if n := r.saves.Load(); n != 2*int32(len(families)) {
		t.Fatalf("%d saves for 4 removals, want %d (two batches)", n, 2*len(families))
	}
	nine := 0
	for _, s := range r.take() {
		if strings.Contains(s, "-X VMON-E9") {
			nine++
		}
	}
	if nine != len(families) {
		t.Errorf("link 9 removed by %d restores, want one per family", nine)
	}
}
