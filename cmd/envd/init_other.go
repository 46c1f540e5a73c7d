//go:build !linux

package main

import (
	"errors"
	"log/slog"
)

func runInit(*slog.Logger, []string) (int, error) {
	return 0, errors.New("init mode is only supported on linux")
}
