// Command registry serves the container images the end-to-end tests build templates from: an
// in-memory OCI registry on a loopback address with fixture images pushed into it.
//
//	go run ./test/registry [--addr 127.0.0.1:0] [--user U --password P] [--oci-layout NAME=DIR]
//
// Once the images are pushed it prints one JSON line on stdout,
//
//	{"addr":"127.0.0.1:PORT","images":{"busybox":"127.0.0.1:PORT/vmon-test/busybox:latest",...}}
//
// and serves until SIGTERM or SIGINT. Fixtures (see fixtures.go):
//
//   - vmon-test/busybox:latest: an index of linux/amd64 (static busybox and bash, users root and
//     app(1234), a file deleted by a whiteout and a directory hidden by an opaque whiteout;
//     USER app, WORKDIR /opt/app, FIXTURE_ENV=from-image) and a one-file linux/arm64 image.
//   - vmon-test/busybox-root:latest: the amd64 base layer alone, no USER, no WORKDIR.
//   - vmon-test/NAME:latest for each --oci-layout NAME=DIR: the image of an OCI layout on disk,
//     e.g. vmon's own (`make image`, bin/image).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	var cfg Config
	verbose := false
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "listen address (loopback only)")
	flag.StringVar(&cfg.User, "user", "", "require HTTP basic auth with this user")
	flag.StringVar(&cfg.Password, "password", "", "password for --user")
	flag.StringVar(&cfg.Busybox, "busybox", "/bin/busybox", "statically linked busybox (Debian busybox-static)")
	flag.StringVar(&cfg.Bash, "bash", "/bin/bash-static", "statically linked bash (Debian bash-static)")
	flag.BoolVar(&verbose, "v", false, "log registry requests on stderr")
	flag.Func("oci-layout", "NAME=DIR: also push the image of the OCI layout DIR as vmon-test/NAME:latest (repeatable)", func(v string) error {
		n, dir, ok := strings.Cut(v, "=")
		if !ok || n == "" || dir == "" {
			return fmt.Errorf("want NAME=DIR, got %q", v)
		}
		if cfg.Layouts == nil {
			cfg.Layouts = map[string]string{}
		}
		cfg.Layouts[n] = dir
		return nil
	})
	flag.Parse()
	if verbose {
		cfg.Log = os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg Config) error {
	s, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	line, err := json.Marshal(s)
	if err != nil {
		s.Close()
		return err
	}
	if _, err := fmt.Printf("%s\n", line); err != nil {
		s.Close()
		return err
	}
	select {
	case <-ctx.Done():
		return s.Close()
	case <-s.Done():
		return fmt.Errorf("serve: %w", s.Err())
	}
}
