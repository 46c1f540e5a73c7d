package doctor

import (
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/limits"
)

func TestLimitsReport(t *testing.T) {
	r := checkLimits(Options{MemoryMB: 512, DiskMB: 2048, Limits: limits.Overrides{Files: 4096}})
	for _, want := range []string{"512 MiB sandbox", "512 tasks", "4096 open files", "/dev/shm 256 MiB", "disk 2048 MiB"} {
		if !strings.Contains(r.Detail, want) {
			t.Errorf("limits report %q lacks %q", r.Detail, want)
		}
	}
	if r := checkLimits(Options{}); !strings.Contains(r.Detail, "no disk limit") {
		t.Errorf("report without a disk limit: %q", r.Detail)
	}
	// This host (CI's included) can enforce disk limits; without one asked for, doctor warns.
	if r := checkDiskLimit(1024); r.Level != OK {
		t.Fatalf("disk limit check on this host: %+v", r)
	}
	if r := checkDiskLimit(0); r.Level != Warn {
		t.Fatalf("disk limit off: %+v", r)
	}
}
