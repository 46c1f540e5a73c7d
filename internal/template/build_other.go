//go:build !linux

package template

import (
	"context"
	"fmt"
	"runtime"
)

// BuildBase is only implemented on Linux.
func BuildBase(ctx context.Context, opts BaseOptions) (Manifest, error) {
	return Manifest{}, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Prune is only implemented on Linux.
func Prune(ctx context.Context, dataDir, id string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// BuildCodeInterpreterRootfs is only implemented on Linux.
func BuildCodeInterpreterRootfs(ctx context.Context, opts BaseOptions) (Manifest, error) {
	return Manifest{}, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}
