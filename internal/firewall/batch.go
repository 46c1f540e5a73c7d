package firewall

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Each iptables-restore reads the tables it touches from the kernel before it changes them, and
// under the nf_tables backend a transaction that finds the ruleset changed meanwhile starts over.
// So a transaction costs time in proportion to the rules of every sandbox on the node, and
// hundreds of them at once (a node killing or starting many sandboxes) contend until each is
// retried many times over. The per-link transactions (attach, update, compaction, detach) touch
// only their own link's chains, so those of one family that queue up while one runs are applied
// together by the next iptables-restore: one read of the tables for the whole batch.
//
// A batch is a concatenation of scripts, each ending in its own COMMITs, and iptables-restore
// commits each table section as it reaches its COMMIT and stops at the first line it refuses: the
// scripts before the refused line are applied, the one holding it failed (as it would have alone,
// possibly with an earlier table of it applied), and the ones after it were never read and go in
// the next batch.

// maxBatch bounds the scripts of one batch, so one refused line sends back a bounded number and
// one iptables-restore never holds up the queue for long.
const maxBatch = 64

// batchTimeout bounds one batched iptables-restore; a waiter whose own context ends earlier stops
// waiting, but the batch it joined runs on.
const batchTimeout = time.Minute

// restoreError is a refused iptables-restore: what it said, and the input it refused.
type restoreError struct {
	bin    string
	err    error // the process's error, with what it printed
	script string
}

func (e *restoreError) Error() string {
	s := e.script
	// The script says which rule the kernel refused; long ones are cut for the log.
	if len(s) > 4096 {
		s = s[:4096] + "..."
	}
	return fmt.Sprintf("%s: %v\n%s", e.bin, e.err, s)
}

func (e *restoreError) Unwrap() error { return e.err }

// refusedLine is how iptables-restore (legacy and nf_tables) names the input line it refused: a
// rule the kernel or the table refused, or one it could not parse.
var refusedLine = regexp.MustCompile(`line (\d+) failed|Error occurred at line: (\d+)`)

// refusedLineOf is the input line err names as refused, or 0.
func refusedLineOf(err error) int {
	m := refusedLine.FindStringSubmatch(err.Error())
	for _, g := range m[min(1, len(m)):] {
		if n, err := strconv.Atoi(g); err == nil {
			return n
		}
	}
	return 0
}

// await waits for a batch worker's answer on done, or for ctx to end first.
func await(ctx context.Context, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type queued struct {
	script string
	done   chan error // buffered: the worker never waits for a waiter that left
}

// batcher applies the per-link transactions of one family.
type batcher struct {
	run runner
	f   family

	mu sync.Mutex
	// +checklocks:mu
	queue []*queued
	// +checklocks:mu
	running bool
}

// restore applies script with the other per-link transactions queued meanwhile. It returns when
// the script was applied or refused, or ctx ended first (then the script may still be applied).
func (b *batcher) restore(ctx context.Context, script string) error {
	q := &queued{script: script, done: make(chan error, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	if !b.running {
		b.running = true
		go b.work()
	}
	b.mu.Unlock()
	return await(ctx, q.done)
}

func (b *batcher) work() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		if rest := b.apply(batch); len(rest) > 0 {
			b.mu.Lock()
			b.queue = append(rest, b.queue...)
			b.mu.Unlock()
		}
	}
}

// apply runs one batch and answers its scripts; it returns those that were never read.
func (b *batcher) apply(batch []*queued) []*queued {
	if len(batch) == 1 {
		batch[0].done <- b.runOne(batch[0].script)
		return nil
	}
	var all strings.Builder
	ends := make([]int, len(batch)) // the last line of each script in the batch
	line := 0
	for i, q := range batch {
		all.WriteString(q.script)
		line += strings.Count(q.script, "\n")
		ends[i] = line
	}
	err := b.runOne(all.String())
	if err == nil {
		for _, q := range batch {
			q.done <- nil
		}
		return nil
	}
	var re *restoreError
	refused := 0
	if errors.As(err, &re) {
		refused = refusedLineOf(re.err)
	}
	k := 0
	for k < len(batch) && ends[k] < refused {
		k++
	}
	if refused == 0 || k == len(batch) {
		// Not a refused line (the process could not run, or timed out): none of them is known
		// to be applied.
		for _, q := range batch {
			q.done <- err
		}
		return nil
	}
	for _, q := range batch[:k] {
		q.done <- nil
	}
	first := 1
	if k > 0 {
		first = ends[k-1] + 1
	}
	batch[k].done <- &restoreError{
		bin:    re.bin,
		err:    fmt.Errorf("%w (line %d of this transaction, in a batch of %d)", re.err, refused-first+1, len(batch)),
		script: batch[k].script,
	}
	return batch[k+1:]
}

func (b *batcher) runOne(script string) error {
	// Not the firewall's background context: a detach queued as the node shuts down still
	// closes its link's chains.
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	return b.run.restore(ctx, b.f, script)
}

// remover coalesces link removals (Remove, Hooks.Remove). Each reads both families' tables
// (iptables-save) and deletes what it found of the link; removals that queue while one runs are
// done together by the next read and delete. A removal is worked out afresh from the tables, so
// one that failed is safe to run again, and every removal of a failed batch gets its error.
type remover struct {
	fw *Firewall

	mu sync.Mutex
	// +checklocks:mu
	pending map[int][]chan error
	// +checklocks:mu
	running bool
}

func (r *remover) remove(ctx context.Context, i int) error {
	done := make(chan error, 1)
	r.mu.Lock()
	if r.pending == nil {
		r.pending = map[int][]chan error{}
	}
	r.pending[i] = append(r.pending[i], done)
	if !r.running {
		r.running = true
		go r.work()
	}
	r.mu.Unlock()
	return await(ctx, done)
}

func (r *remover) work() {
	for {
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		if len(batch) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		err := r.fw.remove(ctx, func(x int) bool { _, ok := batch[x]; return ok })
		cancel()
		for _, chs := range batch {
			for _, ch := range chs {
				ch <- err
			}
		}
	}
}
