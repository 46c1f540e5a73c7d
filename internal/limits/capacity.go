package limits

import "fmt"

// A node's default capacity (vmon serve without --max-sandboxes) comes from what an idle `base`
// sandbox was measured to cost on the reference machine (2 cores, 24 GiB; bench/density.sh,
// docs/benchmarks.md "Density"): about 20 MiB of host memory each and, at 500 live, create and
// command latencies still near those of an empty node. Agents' sandboxes are idle most of the
// time; a node whose sandboxes all work at once needs a lower --max-sandboxes, and the operations
// guide says how to pick it.
const (
	// IdleSandboxMiB is the host memory counted per sandbox: the measured 20 MiB (sentry, gofer,
	// guest stubs, page tables, the sandbox's network namespace and cgroups) with half as much
	// again for what a sandbox touches once it works (page cache, socket buffers).
	IdleSandboxMiB = 32
	// IdleImageSandboxMiB is the same for a sandbox booted from a root image (vmon serve
	// --root-images): 12.5 MiB measured at 500 live (no gofer), with half as much again.
	IdleImageSandboxMiB = 20
	// SandboxesPerCore bounds sandboxes by CPU: two cores held 500 idle ones while creates and
	// commands stayed fast; past that, every create would wait on the others' wake-ups.
	SandboxesPerCore = 250
	// HostReserveShare (percent) and MinHostReserveMiB are the memory left to the host, vmon
	// and the page cache of templates: the larger of the two.
	HostReserveShare  = 10
	MinHostReserveMiB = 1024
	// MinSandboxes is the floor on a tiny host, so that vmon still serves a few.
	MinSandboxes = 4
)

// Capacity is a node's default sandbox bound and how it was reached.
type Capacity struct {
	Max int
	// MemoryBound and CPUBound are the two bounds; Max is the smaller (or MinSandboxes).
	MemoryBound, CPUBound int
	// Bound names the bound that decided: "memory", "cpu" or "minimum".
	Bound string
}

func (c Capacity) String() string {
	return fmt.Sprintf("%d sandboxes (%s bound; memory allows %d, CPU %d)", c.Max, c.Bound, c.MemoryBound, c.CPUBound)
}

// NodeCapacity is the default bound on live sandboxes for a host with memTotalMiB of memory and
// cpus cores, counting perSandboxMiB of memory per sandbox (IdleSandboxMiB or
// IdleImageSandboxMiB).
func NodeCapacity(memTotalMiB int64, cpus int, perSandboxMiB int64) Capacity {
	reserve := max(memTotalMiB*HostReserveShare/100, MinHostReserveMiB)
	c := Capacity{
		MemoryBound: int(max(memTotalMiB-reserve, 0) / max(perSandboxMiB, 1)),
		CPUBound:    max(cpus, 0) * SandboxesPerCore,
	}
	c.Max, c.Bound = c.MemoryBound, "memory"
	if c.CPUBound < c.Max {
		c.Max, c.Bound = c.CPUBound, "cpu"
	}
	if c.Max < MinSandboxes {
		c.Max, c.Bound = MinSandboxes, "minimum"
	}
	return c
}
