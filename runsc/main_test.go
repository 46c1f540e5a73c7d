package main

import "testing"

func TestWatchReleasesOnceAfterEachBusySpell(t *testing.T) {
	w := watch{last: 1000, dirty: true}
	steps := []struct {
		allocs uint64
		want   bool
	}{
		{1000 + 4<<20, false}, // still booting
		{1000 + 4<<20 + 100, true},
	}
	for i, s := range steps {
		if got := w.tick(s.allocs); got != s.want {
			t.Fatalf("step %d: tick(%d) = %v, want %v", i, s.allocs, got, s.want)
		}
	}
	w.reset(5 << 20)
	// Idle: never again, however long.
	for i := 0; i < 10; i++ {
		if w.tick(5<<20 + uint64(i)*1024) {
			t.Fatalf("idle interval %d released again", i)
		}
	}
	// A command runs (allocates), then the process goes quiet: one release.
	base := uint64(5<<20 + 9*1024)
	if w.tick(base + quietBytes) {
		t.Fatal("released during the busy interval")
	}
	if !w.tick(base + quietBytes + quietBytes - 1) {
		t.Fatal("no release at the first quiet interval after the busy one")
	}
}

func TestWatchQuietEdge(t *testing.T) {
	w := watch{last: 0}
	if w.tick(quietBytes - 1) {
		t.Fatal("a quiet interval with nothing to release released")
	}
	if w.tick(2*quietBytes - 1) {
		t.Fatal("quietBytes allocated in an interval is busy, not quiet")
	}
	if !w.tick(2*quietBytes - 1) {
		t.Fatal("no release after the busy interval")
	}
}
