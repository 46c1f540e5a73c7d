//go:build !linux

package firewall

import (
	"fmt"
	"runtime"
)

func newRunner(netns string, tools Tools) (runner, error) {
	return nil, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)
}
