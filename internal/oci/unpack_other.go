//go:build !linux

package oci

import (
	"context"
	"fmt"
	"runtime"
)

// Unpack is only implemented on Linux: its safety rests on openat2's RESOLVE_IN_ROOT.
func (p *Puller) Unpack(ctx context.Context, img *Image, dir string, progress func(string)) error {
	if img == nil || (img.img == nil && img.reopen == nil) {
		return errNoHandle
	}
	return fmt.Errorf("unpacking images is not supported on %s", runtime.GOOS)
}
