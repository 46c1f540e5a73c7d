// Command runsc is gVisor's runsc at the version vmon pins, built by scripts/install-runsc.sh with
// the patches in runsc/patches applied to gVisor, and with one addition here: a long-lived runsc
// process (a sandbox's sentry, its gofer) hands the memory its Go heap no longer uses back to the
// host once it goes idle.
//
// Why: the Go runtime keeps freed heap mapped (the heap goal is at least 4 MiB, and the
// scavenger returns only what lies above it), and every runsc process starts by running the
// init functions of the whole binary, most of whose garbage it never touches again. With
// hundreds of idle sandboxes on a node that retained heap is a fifth of each sandbox's memory.
// runsc starts its sentry and gofer with an empty environment, so GOGC and GODEBUG cannot reach
// them; this is the one place to act.
//
// This package owns that release and nothing else: it must not change runsc's flags, behaviour
// or output.
package main

import (
	"runtime/debug"
	"runtime/metrics"
	"time"

	"gvisor.dev/gvisor/runsc/cli/maincli"
)

const (
	// interval between looks at the heap. Each look is a timer wake-up and a read of a runtime
	// counter; 500 sandboxes (a sentry and a gofer each) make about 70 a second in all.
	interval = 15 * time.Second
	// quietBytes is what a process may allocate in one interval and still count as idle: an idle
	// sentry's timers and an idle gofer allocate next to nothing.
	quietBytes = 256 << 10
)

func main() {
	go releaseWhenIdle()
	maincli.Main()
}

// releaseWhenIdle returns the heap's free memory to the host after each busy spell, once the
// process has been quiet for an interval. It never collects while the process is busy (a
// collection then would slow what the sandbox is doing and free little that stays free), and
// does nothing at all while the process stays idle.
func releaseWhenIdle() {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	allocs := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	// The start is a busy spell: the init functions' garbage and the boot's.
	w := watch{last: allocs(), dirty: true}
	for {
		time.Sleep(interval)
		if w.tick(allocs()) {
			debug.FreeOSMemory()
			w.reset(allocs())
		}
	}
}

// watch decides when to release: after a busy spell (or the start, which is one), at the first
// interval that allocated less than quietBytes.
type watch struct {
	last  uint64
	dirty bool
}

func (w *watch) reset(allocs uint64) {
	w.last = allocs
	w.dirty = false
}

// tick takes the allocation counter at the end of an interval and reports whether to release now.
func (w *watch) tick(allocs uint64) bool {
	busy := allocs-w.last >= quietBytes
	w.last = allocs
	if busy {
		w.dirty = true
		return false
	}
	return w.dirty
}
