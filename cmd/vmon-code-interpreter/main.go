// Command vmon-code-interpreter is the code-execution service of the code-interpreter-v1
// template: it listens on guest port 49999 and runs code for @e2b/code-interpreter in Jupyter
// kernels (internal/codeinterp). The template's start command runs it as the sandbox's user.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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
	java := flag.String("java", "/usr/bin/java", "a JDK's java (with jdk.jshell), for java cells")
	runtimeDir := flag.String("runtime-dir", "", "directory for kernel connection files (default: a private one under /tmp)")
	envd := flag.String("envd", "http://127.0.0.1:49983", "envd's address, to read the sandbox's environment variables")
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
		f, err := os.OpenFile(*logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out = f
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	if err := run(log, *listen, *cwd, *python, *rBin, *node, *bash, *java, *runtimeDir, *envd); err != nil {
		log.Error("code interpreter stopped", "err", err)
		os.Exit(1)
	}
}

// envdEnv reads the sandbox's environment variables from envd (GET /envs), as E2B's service
// does: they are what Sandbox.create's envs set, and they change only with a new /init.
func envdEnv(base string) func(ctx context.Context, token string) (map[string]string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	return func(ctx context.Context, token string) (map[string]string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/envs", nil)
		if err != nil {
			return nil, err
		}
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("envd /envs: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("envd /envs answered %s", resp.Status)
		}
		var env map[string]string
		if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&env); err != nil {
			return nil, fmt.Errorf("envd /envs: %w", err)
		}
		return env, nil
	}
}

func run(log *slog.Logger, listen, cwd, python, rBin, node, bash, java, runtimeDir, envdURL string) error {
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
	// A JRE has java but not jshell (jdk.jshell): Java cells need a JDK.
	if _, err := exec.LookPath(filepath.Join(filepath.Dir(java), "jshell")); err == nil {
		langs["java"] = codeinterp.Java(java)
	}
	srv := codeinterp.New(codeinterp.Options{Languages: langs, Cwd: cwd, RuntimeDir: runtimeDir, Log: log,
		SandboxEnv: envdEnv(envdURL)})
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
