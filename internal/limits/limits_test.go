package limits

import (
	"testing"

	"github.com/vibemon/vmon/internal/runtime"
)

func TestDerive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		memoryMB int
		o        Overrides
		want     runtime.Limits
	}{
		{"default sandbox", 512, Overrides{},
			runtime.Limits{GuestTasks: 512, HostTasks: 2048, NProc: 448, NoFile: 32768, ShmBytes: 256 << 20, HostMemoryMB: 592}},
		{"tiny sandbox hits the floors", 8, Overrides{},
			runtime.Limits{GuestTasks: MinTasks, HostTasks: 896, NProc: MinTasks - MinTasks/NProcReserve, NoFile: MinFiles, ShmBytes: 4 << 20, HostMemoryMB: 72}},
		{"just under the task floor", 127, Overrides{},
			runtime.Limits{GuestTasks: MinTasks, HostTasks: 896, NProc: MinTasks - MinTasks/NProcReserve, NoFile: 8128, ShmBytes: 127 << 19, HostMemoryMB: 194}},
		{"at the task floor", 128, Overrides{},
			runtime.Limits{GuestTasks: 128, HostTasks: 896, NProc: 112, NoFile: 8192, ShmBytes: 64 << 20, HostMemoryMB: 196}},
		{"just over the task floor", 129, Overrides{},
			runtime.Limits{GuestTasks: 129, HostTasks: 899, NProc: 113, NoFile: 8256, ShmBytes: 129 << 19, HostMemoryMB: 197}},
		{"huge sandbox hits the ceilings", 64 << 10, Overrides{},
			runtime.Limits{GuestTasks: MaxTasks, HostTasks: 3*MaxTasks + HostTaskHeadroom, NProc: MaxTasks - MaxTasks/NProcReserve, NoFile: MaxFiles, ShmBytes: 32 << 30, HostMemoryMB: 65536 + 64 + 2048}},
		{"no memory limit counts as 1 GiB", 0, Overrides{},
			runtime.Limits{GuestTasks: 1024, HostTasks: 3584, NProc: 896, NoFile: 65536, ShmBytes: 512 << 20, HostMemoryMB: 1120}},
		{"node overrides", 512, Overrides{Tasks: 100, Files: 2000},
			runtime.Limits{GuestTasks: 100, HostTasks: 812, NProc: 88, NoFile: 2000, ShmBytes: 256 << 20, HostMemoryMB: 592}},
	} {
		if got := Derive(tc.memoryMB, tc.o); got != tc.want {
			t.Errorf("%s: Derive(%d, %+v) = %+v, want %+v", tc.name, tc.memoryMB, tc.o, got, tc.want)
		}
	}
}

func TestOverridesValidate(t *testing.T) {
	for _, tc := range []struct {
		o  Overrides
		ok bool
	}{
		{Overrides{}, true},
		{Overrides{Tasks: 64, Files: 64}, true},
		{Overrides{Tasks: 1 << 22, Files: MaxFiles}, true},
		{Overrides{Tasks: 63}, false},
		{Overrides{Tasks: 1<<22 + 1}, false},
		{Overrides{Files: 63}, false},
		{Overrides{Files: MaxFiles + 1}, false},
		{Overrides{Tasks: -1}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err = %v, want ok=%v", tc.o, err, tc.ok)
		}
	}
}

// The default capacity is the smaller of the memory and CPU bounds, never below the floor.
func TestNodeCapacity(t *testing.T) {
	for _, tc := range []struct {
		name        string
		memMiB      int64
		cpus        int
		perMiB      int64
		max         int
		bound       string
		memoryBound int
	}{
		// The reference machine: 24105 MiB less 10 % is 21695 MiB, 677 sandboxes of 32 MiB; two
		// cores allow 500.
		{"reference machine", 24105, 2, IdleSandboxMiB, 500, "cpu", 677},
		// With root images, 20 MiB each: 1084; the CPU bound still decides.
		{"reference machine, root images", 24105, 2, IdleImageSandboxMiB, 500, "cpu", 1084},
		// 8 GiB, 8 cores: 8192 less 1024 (the minimum reserve beats 10 %) is 7168 MiB, 224.
		{"small memory, many cores", 8192, 8, IdleSandboxMiB, 224, "memory", 224},
		{"small memory, many cores, root images", 8192, 8, IdleImageSandboxMiB, 358, "memory", 358},
		{"big host", 256 << 10, 64, IdleSandboxMiB, 7372, "memory", 7372},
		{"tiny host", 1024, 1, IdleSandboxMiB, MinSandboxes, "minimum", 0},
		{"one core", 65536, 1, IdleSandboxMiB, 250, "cpu", 1843},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NodeCapacity(tc.memMiB, tc.cpus, tc.perMiB)
			if c.Max != tc.max || c.Bound != tc.bound || c.MemoryBound != tc.memoryBound {
				t.Fatalf("NodeCapacity(%d MiB, %d cpus, %d MiB each) = %+v, want max %d (%s bound), memory bound %d", tc.memMiB, tc.cpus, tc.perMiB, c, tc.max, tc.bound, tc.memoryBound)
			}
		})
	}
}
