// Command vmon-code-interpreter is the code-execution service of the code-interpreter-v1
// template: it listens on guest port 49999 and runs code for @e2b/code-interpreter in Jupyter
// kernels (internal/codeinterp). The template's start command runs it as the sandbox's user.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp"
)

func main() {
	listen := flag.String("listen", ":49999", "address to serve on")
	cwd := flag.String("cwd", "", "working directory of new contexts (default: $HOME)")
	python := flag.String("python", "/usr/bin/python3", "Python with ipykernel")
	rBin := flag.String("r", "/usr/bin/R", "R with IRkernel (languages without their interpreter are reported unavailable)")
	node := flag.String("node", "/usr/bin/node", "Node.js, for javascript and typescript")
	bash := flag.String("bash", "/bin/bash", "bash, for bash cells")
	runtimeDir := flag.String("runtime-dir", "", "directory for kernel connection files (default: a private one under /tmp)")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	logFile := flag.String("log-file", "", "append the log to this file instead of stderr (the template's start command has no reader)")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := os.Stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out = f
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	if err := run(log, *listen, *cwd, *python, *rBin, *node, *bash, *runtimeDir); err != nil {
		log.Error("code interpreter stopped", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, listen, cwd, python, rBin, node, bash, runtimeDir string) error {
	if cwd == "" {
		cwd, _ = os.UserHomeDir()
	}
	if runtimeDir == "" {
		dir, err := os.MkdirTemp("", "vmon-code-interpreter-")
		if err != nil {
			return err
		}
		runtimeDir = dir
	}
	langs := map[string]codeinterp.Language{}
	if _, err := exec.LookPath(python); err == nil {
		langs["python"] = codeinterp.Python(python)
	}
	if _, err := exec.LookPath(rBin); err == nil {
		langs["r"] = codeinterp.R(rBin)
	}
	if _, err := exec.LookPath(node); err == nil {
		langs["javascript"] = codeinterp.Node(node, "javascript")
		langs["typescript"] = codeinterp.Node(node, "typescript")
	}
	if _, err := exec.LookPath(bash); err == nil {
		langs["bash"] = codeinterp.Bash(bash)
	}
	srv := codeinterp.New(codeinterp.Options{Languages: langs, Cwd: cwd, RuntimeDir: runtimeDir, Log: log})
	defer srv.Close()
	hs := &http.Server{Addr: listen, Handler: srv, ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		if err := srv.Start(ctx); err != nil {
			log.Error("the default Python context did not start; /health stays 503", "err", err)
			return
		}
		log.Info("code interpreter ready", "listen", listen, "cwd", cwd, "runtime_dir", filepath.Clean(runtimeDir))
	}()
	errc := make(chan error, 1)
	go func() { errc <- hs.ListenAndServe() }()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}
	return nil
}
