//go:build !linux

package netpool

import (
	"context"
	"fmt"
	"runtime"
)

// New is only implemented on Linux.
func New(ctx context.Context, cfg Config) (*Pool, error) {
	return nil, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}
