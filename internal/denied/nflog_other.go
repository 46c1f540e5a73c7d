//go:build !linux

package denied

import (
	"context"
	"errors"
	"log/slog"
)

// Listen needs Linux's NFLOG.
func Listen(context.Context, uint16, *slog.Logger, func(Packet)) error {
	return errors.New("reading refused packets needs Linux (NFLOG)")
}
