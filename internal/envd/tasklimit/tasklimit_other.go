//go:build !linux

package tasklimit

import "errors"

// Apply is only possible inside a Linux sandbox.
func Apply(int) error { return errors.New("task limits need Linux cgroups") }

// CurrentFile is only possible inside a Linux sandbox.
func CurrentFile() (string, error) { return "", errors.New("task counts need Linux cgroups") }
