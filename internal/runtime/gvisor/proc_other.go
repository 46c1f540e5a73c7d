//go:build !linux

package gvisor

import (
	"fmt"
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
