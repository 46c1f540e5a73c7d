package tasklimit

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Apply sets the pids limit of this process's cgroup to max.
func Apply(max int) error {
	if max <= 0 {
		return fmt.Errorf("task limit must be positive, got %d", max)
	}
	dir, err := Dir()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		return fmt.Errorf("set the guest task limit: %w", err)
	}
	return nil
}

// CurrentFile is the pids.current file of this process's cgroup: the guest's task count, which
// the out-of-memory killer reads to account for what each task costs the host.
func CurrentFile() (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "pids.current"), nil
}

// Dir is the directory of this process's cgroup in the pids hierarchy.
func Dir() (string, error) {
	cg, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer cg.Close()
	path, err := cgroupPath(cg, "pids")
	if err != nil {
		return "", err
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer mi.Close()
	point, root, err := mountOf(mi, "pids")
	if err != nil {
		return "", err
	}
	return cgroupDir(point, root, path)
}
