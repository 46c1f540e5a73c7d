package denied

import (
	"context"
	"fmt"
	"log/slog"

	nflog "github.com/florianl/go-nflog/v2"
)

// Listen reads NFLOG group in the caller's network namespace and calls fn for every refused
// packet until ctx ends. fn runs on the reading goroutine: keep it cheap.
func Listen(ctx context.Context, group uint16, log *slog.Logger, fn func(Packet)) error {
	nf, err := nflog.Open(&nflog.Config{Group: group, Copymode: nflog.CopyPacket, Bufsize: 128})
	if err != nil {
		return fmt.Errorf("open NFLOG group %d: %w", group, err)
	}
	hook := func(a nflog.Attribute) int {
		if a.Payload == nil {
			return 0
		}
		p, err := ParsePacket(*a.Payload)
		if err != nil {
			log.Debug("unparsable NFLOG packet", "err", err)
			return 0
		}
		fn(p)
		return 0
	}
	errFn := func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		log.Warn("reading NFLOG", "group", group, "err", err)
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, errFn); err != nil {
		nf.Close()
		return fmt.Errorf("register NFLOG group %d: %w", group, err)
	}
	go func() {
		<-ctx.Done()
		nf.Close()
	}()
	return nil
}
