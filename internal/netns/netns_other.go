//go:build !linux

package netns

import (
	"context"
	"fmt"
	"runtime"
)

// Create is only implemented on Linux.
func Create(ctx context.Context, name string) (string, error) {
	return "", fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Delete is only implemented on Linux.
func Delete(ctx context.Context, name string) error {
	return fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// List is only implemented on Linux.
func List(ctx context.Context) ([]string, error) {
	return nil, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}

// Do is Linux-only.
func Do(string, func() error) error { return ErrUnsupported }
