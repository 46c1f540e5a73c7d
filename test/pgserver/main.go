// Command vmon-test-pg runs a PostgreSQL server for the end-to-end tests (internal/testutil/pgtest:
// Debian's binaries, a temporary directory, a Unix socket only). It prints one JSON line with a
// fresh database's DSN, then runs until its standard input closes or it is signalled, and removes
// everything it made.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/vibemon/vmon/internal/testutil/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmon-test-pg:", err)
		os.Exit(1)
	}
	defer srv.Stop()
	dsn, err := srv.CreateDB(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmon-test-pg:", err)
		return
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]string{"dsn": dsn, "dir": srv.Dir()}); err != nil {
		return
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-ctx.Done():
	case <-done:
	}
}
