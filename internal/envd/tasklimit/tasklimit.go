// Package tasklimit caps the number of tasks (processes and threads) in the guest, from inside:
// envd, as the guest's init, writes the limit into the pids controller of its own cgroup before
// it starts anything, so every process of the sandbox is under it and a fork bomb gets EAGAIN in
// the guest instead of taking the sandbox over its host task limit. It owns only that write; it
// never creates or moves cgroups, and it must never be used outside a sandbox.
package tasklimit

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// cgroupPath returns the path of the cgroup of controller ctrl in /proc/self/cgroup's text.
func cgroupPath(procCgroup io.Reader, ctrl string) (string, error) {
	sc := bufio.NewScanner(procCgroup)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == ctrl {
				return parts[2], nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no %s cgroup in /proc/self/cgroup", ctrl)
}

// mountOf returns where the cgroup v1 hierarchy of ctrl is mounted and which of its cgroups is
// the mount's root, from /proc/self/mountinfo's text.
func mountOf(mountinfo io.Reader, ctrl string) (point, root string, err error) {
	sc := bufio.NewScanner(mountinfo)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		left, right, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 || rf[0] != "cgroup" {
			continue
		}
		for _, o := range strings.Split(rf[2], ",") {
			if o == ctrl {
				return lf[4], lf[3], nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", fmt.Errorf("the %s cgroup controller is not mounted", ctrl)
}

// cgroupDir is the directory of the cgroup at path in a hierarchy mounted at point with root as
// its root cgroup.
func cgroupDir(point, root, path string) (string, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("cgroup %s is outside the mounted hierarchy %s", path, root)
	}
	return filepath.Join(point, rel), nil
}
