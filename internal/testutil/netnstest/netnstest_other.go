//go:build !linux

package netnstest

import (
	"runtime"
	"testing"
)

// RequireRoot fails: real-kernel topologies exist only on Linux.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	tb.Fatalf("%v (%s)", ErrUnsupported, runtime.GOOS)
}
