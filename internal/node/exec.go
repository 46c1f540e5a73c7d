package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/fsroot"
)

// guestCmd is a shell command the node itself runs in a sandbox through envd, as the SDK would:
// template start and ready commands, and template build steps.
type guestCmd struct {
	// Shell runs Script with "-c" (bash as a login shell, like the SDK, when the image has it).
	Shell  []string
	Script string
	User   string
	Env    map[string]string
	Cwd    string
	// Tag is envd's process tag: agentproto.StartCmdTag has envd log the command's output too,
	// and other vmon- tags mark the node's own commands, logged at debug level.
	Tag string
}

// shellFor picks the shell for node-run commands in the root filesystem mounted at root: the
// SDK's `bash -l` when the image has bash, else POSIX sh (busybox and distroless-like images).
func shellFor(root string) []string { return loginShell(fsroot.Exists(root, "bin/bash")) }

// guestShell is the shell chosen when sb booted; a sandbox adopted after a restart uses /bin/sh.
func (sb *sandbox) guestShell() []string {
	if sb.shell != nil {
		return sb.shell
	}
	return []string{"/bin/sh"}
}

// loginShell is bash as a login shell when the guest has it, else /bin/sh.
func loginShell(bash bool) []string {
	if bash {
		return []string{"/bin/bash", "-l"}
	}
	return []string{"/bin/sh"}
}

func processClient(ch *agent.Channel) processconnect.ProcessClient {
	return processconnect.NewProcessClient(&http.Client{Transport: ch.Transport()}, envdURL(""))
}

func (c guestCmd) request() *connect.Request[process.StartRequest] {
	args := append(append([]string{}, c.Shell[1:]...), "-c", c.Script)
	cfg := &process.ProcessConfig{Cmd: c.Shell[0], Args: args, Envs: c.Env}
	if c.Cwd != "" {
		cfg.Cwd = &c.Cwd
	}
	noStdin := false
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &noStdin})
	if c.Tag != "" {
		req.Msg.Tag = &c.Tag
	}
	if c.User != "" {
		// envd takes the user from Basic auth with an empty password, as the SDK sends it.
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.User+":")))
	}
	return req
}

func withToken[T any](req *connect.Request[T], token string) *connect.Request[T] {
	if token != "" {
		req.Header().Set("X-Access-Token", token)
	}
	return req
}

// runGuest runs c to completion and returns its exit code; output goes to out as it arrives.
func runGuest(ctx context.Context, ch *agent.Channel, token string, c guestCmd, out func(stderr bool, data []byte)) (int, error) {
	stream, err := processClient(ch).Start(ctx, withToken(c.request(), token))
	if err != nil {
		return -1, fmt.Errorf("start %q: %w", c.Script, err)
	}
	defer stream.Close()
	var end *process.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil && out != nil {
			if b := d.GetStdout(); len(b) > 0 {
				out(false, b)
			}
			if b := d.GetStderr(); len(b) > 0 {
				out(true, b)
			}
		}
		if e := ev.GetEnd(); e != nil {
			end = e
		}
	}
	if err := stream.Err(); err != nil {
		return -1, fmt.Errorf("run %q: %w", c.Script, err)
	}
	if end == nil {
		return -1, errors.New("process stream ended without an end event")
	}
	if !end.GetExited() && end.GetError() != "" {
		return int(end.GetExitCode()), fmt.Errorf("run %q: %s", c.Script, end.GetError())
	}
	return int(end.GetExitCode()), nil
}

// startGuest starts c in the background and returns once envd reports it started. It keeps
// running after this returns: envd only stops a process whose client deadline passed, and this
// stream is closed without one.
func startGuest(ctx context.Context, ch *agent.Channel, token string, c guestCmd) (uint32, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	type result struct {
		pid uint32
		err error
	}
	done := make(chan result, 1)
	go func() {
		stream, err := processClient(ch).Start(sctx, withToken(c.request(), token))
		if err != nil {
			done <- result{err: fmt.Errorf("start %q: %w", c.Script, err)}
			return
		}
		defer stream.Close()
		for stream.Receive() {
			if s := stream.Msg().GetEvent().GetStart(); s != nil {
				done <- result{pid: s.GetPid()}
				return
			}
		}
		done <- result{err: fmt.Errorf("start %q: stream ended before the start event: %v", c.Script, stream.Err())}
	}()
	select {
	case r := <-done:
		return r.pid, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// mergeEnv layers the sandbox's envVars over the template's environment.
func mergeEnv(template, sandbox map[string]string) map[string]string {
	if len(template) == 0 {
		return sandbox
	}
	out := make(map[string]string, len(template)+len(sandbox))
	for k, v := range template {
		out[k] = v
	}
	for k, v := range sandbox {
		out[k] = v
	}
	return out
}

// readyInterval is how often a template's ready command is retried.
const readyInterval = 100 * time.Millisecond

// startTemplateCmd starts the template's start command as the sandbox's default user and waits
// until its ready command exits 0 (a template without one is ready once the command started).
func (n *Node) startTemplateCmd(ctx context.Context, sb *sandbox, spec CreateSpec, img Image) error {
	shell := sb.guestShell()
	cmd := guestCmd{Shell: shell, Script: img.StartCmd, User: spec.DefaultUser, Cwd: spec.DefaultWorkdir, Tag: agentproto.StartCmdTag}
	if _, err := startGuest(ctx, sb.ch, spec.AccessToken, cmd); err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	if img.ReadyCmd == "" {
		return nil
	}
	return waitReady(ctx, sb.ch, spec.AccessToken, guestCmd{Shell: shell, Script: img.ReadyCmd,
		User: spec.DefaultUser, Cwd: spec.DefaultWorkdir, Tag: agentproto.InternalTagPrefix + "ready-cmd"}, n.opts.ReadyTimeout, nil)
}

// waitReady reruns ready until it exits 0 or timeout passes; each failed attempt's output goes
// to attempt (when set) so a build can show why it never became ready.
func waitReady(ctx context.Context, ch *agent.Channel, token string, ready guestCmd, timeout time.Duration,
	attempt func(exit int, output []byte)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for n := 1; ; n++ {
		var out []byte
		// Each attempt is cut short at the overall deadline, so a hanging ready command cannot
		// hold the create past it.
		exit, err := runGuest(ctx, ch, token, ready, func(_ bool, b []byte) {
			if len(out) < 4096 {
				out = append(out, b...)
			}
		})
		if err == nil && exit == 0 {
			return nil
		}
		if attempt != nil && err == nil {
			attempt(exit, out)
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("ready command did not succeed within %s (%d attempts; last: %v)", timeout, n, err)
			}
			return fmt.Errorf("ready command did not succeed within %s (%d attempts; last exit code %d: %s)",
				timeout, n, exit, tail(out, 512))
		case <-time.After(readyInterval):
		}
	}
}

// tail returns at most the last n bytes of b as trimmed text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
