//go:build !linux

package reaper

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
)

// Reaper is Linux-only; elsewhere New fails.
type Reaper struct{}

// New fails: reaping orphans needs Linux's subreaper support.
func New(*slog.Logger) (*Reaper, error) { return nil, errors.New("reaper: not supported on this OS") }

func (*Reaper) Start(cmd *exec.Cmd) error { return cmd.Start() }
func (*Reaper) Forget(int)                {}
func (*Reaper) Run(context.Context)       {}

// Alone is never known here.
func (*Reaper) Alone() bool { return false }

// Activity never fires here.
func (*Reaper) Activity() <-chan struct{} { return nil }
