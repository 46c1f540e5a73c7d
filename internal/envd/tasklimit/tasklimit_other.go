//go:build !linux

package tasklimit

import "errors"

// Apply is only possible inside a Linux sandbox.
func Apply(int) error { return errors.New("task limits need Linux cgroups") }
