//go:build !linux

package rootfs

import (
	"context"
	"fmt"
	"runtime"
)

// Prepare is only implemented on Linux.
func Prepare(ctx context.Context, lowers []string, sandboxDir string, opts Options) (string, error) {
	return "", fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Release is only implemented on Linux.
func Release(ctx context.Context, sandboxDir string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Mounted is only implemented on Linux.
func Mounted(path string) (bool, error) {
	return false, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// LowerInUse is only implemented on Linux.
func LowerInUse(dir string) (bool, error) {
	return false, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// RemoveTree is only implemented on Linux.
func RemoveTree(dir string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Commit is only implemented on Linux.
func Commit(ctx context.Context, sandboxDir, dst string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// DiskSupported is only implemented on Linux.
func DiskSupported() error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Stash is only implemented on Linux.
func Stash(ctx context.Context, sandboxDir, dst string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// CopyWritable is only implemented on Linux.
func CopyWritable(ctx context.Context, sandboxDir, dst string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// DiskHolders is only implemented on Linux (no sandbox has a disk elsewhere).
func DiskHolders(sandboxDir string) ([]string, error) { return nil, nil }
