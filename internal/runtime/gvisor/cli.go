package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/runtime"
)

// runsc is the one place runsc is invoked. Every invocation carries the same global flags, above
// all --root: runsc keeps a sandbox's state under its root and finds nothing without it, and the
// flags a sandbox was created with must match the ones later commands use. Only run and restore
// may add flags of their own sandbox (runDetached), ones no later command reads.
type runsc struct {
	path  string
	flags []string
	log   *slog.Logger
}

// containerState is `runsc state` / `runsc list --format=json` output (the OCI state).
type containerState struct {
	ID     string `json:"id"`
	Status string `json:"status"` // created, running, paused, stopped
	Pid    int    `json:"pid"`    // the sandbox (sentry) process
	Bundle string `json:"bundle"`
}

// runscEnv is runsc's whole environment: it must not inherit the caller's knobs (e.g. a TMPDIR
// on a vanished dir).
var runscEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// errNotExist is returned (wrapped) when runsc has no container with the id.
var errNotExist = errors.New("runsc: container does not exist")

func (c *runsc) command(ctx context.Context, sub string, args ...string) *exec.Cmd {
	return c.commandWith(ctx, nil, sub, args...)
}

// commandWith is command with global flags of one sandbox's own after the shared ones (so
// overriding them: runsc takes the last of a repeated flag).
func (c *runsc) commandWith(ctx context.Context, global []string, sub string, args ...string) *exec.Cmd {
	argv := append(slices.Concat(c.flags, global, []string{sub}), args...)
	cmd := exec.CommandContext(ctx, c.path, argv...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Env = runscEnv
	return cmd
}

// run runs a short runsc command and returns its stdout; the error carries stderr.
func (c *runsc) run(ctx context.Context, sub string, args ...string) ([]byte, error) {
	return c.output(c.command(ctx, sub, args...), sub, args)
}

// output runs cmd, the runsc command sub with args, and returns its stdout; the error carries
// stderr.
func (c *runsc) output(cmd *exec.Cmd, sub string, args []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	c.log.Debug("runsc", "cmd", sub, "args", args, "took", time.Since(start), "err", err)
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "does not exist") {
			return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", sub, errNotExist, msg)
		}
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", sub, err, msg)
	}
	return stdout.Bytes(), nil
}

// runDetached creates the sandbox (sentry and gofer) and starts its init process in one runsc
// invocation: create then start would pay for a second runsc process on the create path. With
// imageDir it restores that checkpoint instead of starting init. The sandbox inherits out as the
// container's stdout and stderr and runs in its own session, so it neither depends on this
// process's pipes nor dies with it. global are runsc flags of this sandbox's own (commandWith).
func (c *runsc) runDetached(ctx context.Context, global []string, id, bundle, pidFile, imageDir string, out *os.File, files []*os.File) error {
	sub, args := "run", append([]string{"--detach", "--bundle", bundle, "--pid-file", pidFile}, passFDs(files)...)
	if imageDir != "" {
		// --background: the sandbox runs once the kernel state and the page metadata are in;
		// the memory pages keep loading behind it (the image is uncompressed, as required).
		sub, args = "restore", append(args, "--image-path="+imageDir, "--background")
	}
	cmd := c.commandWith(ctx, global, sub, append(args, id)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = files
	start := time.Now()
	err := cmd.Run()
	c.log.Debug("runsc", "cmd", sub, "id", id, "took", time.Since(start), "err", err)
	if err != nil {
		return fmt.Errorf("runsc %s: %w", sub, err)
	}
	return nil
}

// runMarked runs a runsc command under a shell that creates the file mark once runsc exits 0.
// The shell and runsc run in their own session and outlive this process, so mark tells a later
// process whether a command this one started (a checkpoint) finished after it died. Their output
// goes to mark.log, not to pipes that die with this process (runsc would die of SIGPIPE); it is
// removed on success and read for the error otherwise. Cancelling ctx kills both.
func (c *runsc) runMarked(ctx context.Context, mark, sub string, args ...string) error {
	logPath := mark + ".log"
	argv := append(append(slices.Clone(c.flags), sub), args...)
	script := `m=$1; shift; "$@" >"$m.log" 2>&1 || exit; rm -f "$m.log"; : >"$m"`
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", script, "sh", mark, c.path}, argv...)...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.Env = runscEnv
	start := time.Now()
	err := cmd.Run()
	c.log.Debug("runsc", "cmd", sub, "args", args, "took", time.Since(start), "err", err)
	if err != nil {
		msg := tail(logPath, 2048)
		_ = os.Remove(logPath)
		if strings.Contains(msg, "does not exist") {
			return fmt.Errorf("runsc %s: %w: %s", sub, errNotExist, msg)
		}
		return fmt.Errorf("runsc %s: %w: %s", sub, err, msg)
	}
	return nil
}

func (c *runsc) state(ctx context.Context, id string) (containerState, error) {
	out, err := c.run(ctx, "state", id)
	if err != nil {
		return containerState{}, err
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return containerState{}, fmt.Errorf("runsc state: decode %q: %w", out, err)
	}
	return st, nil
}

func (c *runsc) list(ctx context.Context) ([]containerState, error) {
	out, err := c.run(ctx, "list", "--format=json")
	if err != nil {
		return nil, err
	}
	var sts []containerState // runsc prints "null" when there is none
	if err := json.Unmarshal(out, &sts); err != nil {
		return nil, fmt.Errorf("runsc list: decode %q: %w", out, err)
	}
	return sts, nil
}

func (c *runsc) kill(ctx context.Context, id, signal string) error {
	_, err := c.run(ctx, "kill", id, signal)
	return err
}

// deleteForce kills the sandbox if it still runs and removes its state and cgroup.
func (c *runsc) deleteForce(ctx context.Context, id string) error {
	_, err := c.run(ctx, "delete", "--force", id)
	return err
}

// exec runs args in the sandbox, with files as its descriptors from runtime.FirstFile on, and
// returns its combined output.
func (c *runsc) exec(ctx context.Context, id string, files []*os.File, args []string) ([]byte, error) {
	cmd := c.command(ctx, "exec", slices.Concat(passFDs(files), []string{id}, args)...)
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("runsc exec: %w", err)
	}
	return out, nil
}

// passFDs are the runsc flags that give the guest process the files a command passes runsc as its
// ExtraFiles, under the same numbers: exec.Cmd gives ExtraFiles[i] descriptor 3+i, which is
// runtime.FirstFile+i.
func passFDs(files []*os.File) []string {
	var args []string
	for i := range files {
		fd := runtime.FirstFile + i
		args = append(args, fmt.Sprintf("--pass-fd=%d:%d", fd, fd))
	}
	return args
}
