package tasklimit

import (
	"fmt"
	"os"
	"strconv"
)

// Apply sets the pids limit of this process's cgroup to max.
func Apply(max int) error {
	if max <= 0 {
		return fmt.Errorf("task limit must be positive, got %d", max)
	}
	cg, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return err
	}
	defer cg.Close()
	path, err := cgroupPath(cg, "pids")
	if err != nil {
		return err
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer mi.Close()
	point, root, err := mountOf(mi, "pids")
	if err != nil {
		return err
	}
	file, err := limitFile(point, root, path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(max)), 0); err != nil {
		return fmt.Errorf("set the guest task limit: %w", err)
	}
	return nil
}
