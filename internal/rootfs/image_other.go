//go:build !linux

package rootfs

import (
	"context"
	"fmt"
	"runtime"
)

// CreateImage is only implemented on Linux.
func CreateImage(ctx context.Context, img string, size int64, imageDir string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// MountImage is only implemented on Linux.
func MountImage(img, dir string) error { return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS) }

// Unmount is only implemented on Linux.
func Unmount(dir string) error { return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS) }

// BindNoSuid is only implemented on Linux.
func BindNoSuid(dir string) error { return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS) }
