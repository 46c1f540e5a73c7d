//go:build !linux

package gvisor

import (
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"syscall"

	"github.com/vibemon/vmon/internal/runtime"
)

func supported() error {
	return fmt.Errorf("%w: gVisor runs only on Linux, not %s", runtime.ErrUnsupported, goruntime.GOOS)
}

func sysProcAttr() *syscall.SysProcAttr { return nil }

func sandboxAlive(pid int, id string) bool { return false }

func removeCgroups(parent, id string) error { return supported() }

func killGroup(int) error { return supported() }

func checkpointRunning(string, string) bool { return false }

type waitStatus = int

type watcher struct{}

type pidfd struct{ pid int }

func newWatcher(bool) (*watcher, error)                { return &watcher{}, nil }
func (*watcher) track(string, int) (*pidfd, error)     { return nil, supported() }
func (*watcher) forget(string)                         {}
func (*watcher) lookup(string) *pidfd                  { return nil }
func (*watcher) reapRunscOrphans()                     {}
func readPidFile(string) (int, error)                  { return 0, supported() }
func readCgroupCounters(string, string) cgroupCounters { return cgroupCounters{} }
func classify(waitStatus, bool, cgroupCounters) runtime.Exit {
	return runtime.Exit{Reason: runtime.ExitUnknown, Code: -1}
}

type cgroupCounters struct{}

func (*watcher) wait(context.Context, *pidfd) (waitStatus, bool, error) { return 0, false, supported() }

func raiseMemoryLimit(parent, id string, bytes int64) error { return supported() }

func memoryUsageFile(parent, id string) (string, error) { return "", supported() }

func memoryThresholds(string, string, []uint64) (*os.File, error) { return nil, supported() }
