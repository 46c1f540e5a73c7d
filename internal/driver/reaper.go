package driver

import (
	"container/heap"
	"context"
	"time"
)

// maxConcurrentExpiries bounds node destroy calls issued by the expiry loop at once, so a burst of
// sandboxes expiring together does not stampede the node.
const maxConcurrentExpiries = 8

type deadline struct {
	at time.Time
	id string
}

// deadlineHeap is a min-heap of deadlines by time.
type deadlineHeap []deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// arm schedules id to expire at t, replacing any earlier schedule. Old heap entries stay in the
// heap and are skipped when they surface, which keeps updates O(log n) without an index.
func (d *Driver) arm(id string, t time.Time) {
	d.mu.Lock()
	d.deadlines[id] = t
	// A driver that does not lead keeps the deadlines only: nothing would pop its heap, which
	// every extension through any driver would grow. It builds the heap when it starts leading.
	if d.opts.Leader == nil || d.opts.Leader.Leading() {
		heap.Push(&d.heap, deadline{at: t, id: id})
	}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// rebuildHeap makes the heap of the current deadlines, for a driver that starts leading.
func (d *Driver) rebuildHeap() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.heap = d.heap[:0]
	for id, t := range d.deadlines {
		d.heap = append(d.heap, deadline{at: t, id: id})
	}
	heap.Init(&d.heap)
}

// current reports whether e is id's live schedule. Caller holds d.mu.
func (d *Driver) current(e deadline) bool {
	t, ok := d.deadlines[e.id]
	return ok && t.Equal(e.at)
}

// reapLoop is the single goroutine that expires sandboxes: it sleeps until the earliest deadline
// (or until a new one is armed), then kills everything due. A driver that shares its store and
// does not lead keeps the schedule but fires nothing: the leader expires every sandbox, once.
func (d *Driver) reapLoop(ctx context.Context) {
	slots := make(chan struct{}, maxConcurrentExpiries)
	for {
		var lost <-chan struct{}
		if l := d.opts.Leader; l != nil {
			// The channel first: a change between the two calls then still wakes the wait.
			lost = l.Changed()
			if !l.Leading() {
				select {
				case <-ctx.Done():
					return
				case <-lost:
				}
				if l.Leading() {
					d.rebuildHeap()
				}
				continue
			}
		}
		d.mu.Lock()
		for d.heap.Len() > 0 && !d.current(d.heap[0]) {
			heap.Pop(&d.heap)
		}
		var fire <-chan time.Time
		if d.heap.Len() > 0 {
			fire = d.clock.At(d.heap[0].at)
		}
		d.mu.Unlock()

		select {
		case <-ctx.Done():
			return
		case <-d.wake:
			continue
		case <-lost:
			continue
		case <-fire:
		}

		now := d.now()
		var due []string
		d.mu.Lock()
		for d.heap.Len() > 0 && !d.heap[0].at.After(now) {
			e := heap.Pop(&d.heap).(deadline)
			if d.current(e) {
				delete(d.deadlines, e.id)
				due = append(due, e.id)
			}
		}
		d.mu.Unlock()
		for _, id := range due {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				defer func() { <-slots }()
				d.expire(ctx, id)
			}()
		}
	}
}
