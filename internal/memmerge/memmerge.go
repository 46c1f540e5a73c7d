// Package memmerge lets the kernel merge identical memory pages (KSM) across the runsc
// processes of a node's sandboxes. It marks vmon's own process with PR_SET_MEMORY_MERGE, which
// the kernel hands on to every process vmon starts afterwards (a sandbox's sentry and gofer
// included), and makes sure ksmd, the kernel thread that does the merging, runs.
//
// What merges is private anonymous memory only: the Go heaps of sentries and gofers (pages the
// init functions and boot of the one runsc binary leave identical, and pages that hold only
// zeros). A guest's own memory is a shared memfd, which KSM never touches, so the contents of a
// tenant's files and processes are never merged with another's.
//
// This package owns that process flag and ksmd's on switch. It never changes ksmd's pace
// (pages_to_scan, sleep_millisecs, the advisor): how much CPU merging may take is the operator's
// call.
package memmerge

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// prSetMemoryMerge is PR_SET_MEMORY_MERGE (Linux 6.4); x/sys/unix does not name it.
const prSetMemoryMerge = 67

// SysDir is where the kernel exposes KSM's switches and counters.
const SysDir = "/sys/kernel/mm/ksm"

// Enable marks this process and all it starts from now on for merging, checks that the mark
// reaches a process started through exec (the kernel carries it across exec only from Linux
// 6.7), and starts ksmd if it is stopped. It returns KSM's state as it found it and whether it
// started ksmd. Processes started before the call (sandboxes adopted from an earlier run of
// vmon) are not marked.
func Enable(ctx context.Context) (h Host, started bool, err error) {
	h, err = ReadHost(SysDir)
	if err != nil {
		return h, false, err
	}
	if !h.Available {
		return h, false, fmt.Errorf("this kernel has no KSM (no %s); it needs CONFIG_KSM", SysDir)
	}
	if err := mark(ctx); err != nil {
		return h, false, err
	}
	started, err = startKsmd(SysDir, h.Run)
	return h, started, err
}

// mark sets PR_SET_MEMORY_MERGE on this process and checks that a child started through exec
// carries it.
func mark(ctx context.Context) error {
	if err := unix.Prctl(prSetMemoryMerge, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("mark vmon's memory mergeable (PR_SET_MEMORY_MERGE needs Linux 6.4 or later with CONFIG_KSM): %w", err)
	}
	out, err := exec.CommandContext(ctx, "cat", "/proc/self/ksm_stat").Output()
	if err != nil {
		return fmt.Errorf("read a child's /proc/self/ksm_stat: %w", err)
	}
	if st := parseStat(out); st["ksm_merge_any"] != "yes" {
		return errors.New("processes vmon starts do not keep the merge mark (the kernel carries PR_SET_MEMORY_MERGE across exec from Linux 6.7)")
	}
	return nil
}

// startKsmd turns ksmd on when it is stopped (0) or unmerging (2), and reports whether it did.
func startKsmd(dir string, run int) (bool, error) {
	if run == 1 {
		return false, nil
	}
	path := filepath.Join(dir, "run")
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return false, fmt.Errorf("start ksmd (write 1 to %s): %w", path, err)
	}
	return true, nil
}

// parseStat parses the "key value" or "key: value" lines of /proc/<pid>/ksm_stat.
func parseStat(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		out[strings.TrimSuffix(k, ":")] = strings.TrimSpace(v)
	}
	return out
}

// Host is what the kernel says about KSM on this host.
type Host struct {
	// Available is false when the kernel has no KSM.
	Available bool
	// Run is ksmd's state: 0 stopped, 1 merging, 2 unmerging everything.
	Run int
	// PagesToScan and SleepMillis are ksmd's pace: so many pages per wake-up.
	PagesToScan, SleepMillis int
}

// ReadHost reads KSM's switches from dir (SysDir on a real host).
func ReadHost(dir string) (Host, error) {
	h := Host{Available: true}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"run", &h.Run}, {"pages_to_scan", &h.PagesToScan}, {"sleep_millisecs", &h.SleepMillis}} {
		v, err := readInt(filepath.Join(dir, f.name))
		if errors.Is(err, os.ErrNotExist) && f.name == "run" {
			return Host{}, nil
		}
		if err != nil {
			return Host{}, err
		}
		*f.dst = v
	}
	return h, nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}
