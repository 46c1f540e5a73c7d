//go:build !linux

package server

import (
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

func setClock(time.Time) error {
	return errdefs.Unavailable("setting the clock is only supported on linux")
}

func diskUsage(string) (used, total uint64) { return 0, 0 }
