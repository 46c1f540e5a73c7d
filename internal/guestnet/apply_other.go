//go:build !linux

package guestnet

import "errors"

// Apply is Linux-only: vmon guests are Linux.
func Apply(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return errors.New("guest network: configuring an interface is only supported in a Linux guest")
}
