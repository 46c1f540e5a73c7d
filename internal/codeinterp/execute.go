package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// executeRequest is POST /execute's body, as @e2b/code-interpreter sends it.
type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
	// token is the envd access token the SDK sends with each execution (X-Access-Token): the
	// service proves it to envd to read the sandbox's variables.
	token string
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// mimeKeys maps the MIME types kernels publish to the short keys the SDK reads.
var mimeKeys = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// result turns a kernel's MIME bundle into the SDK's result line: known types under their short
// keys, the rest in "extra" (as E2B's service sends them).
func result(data map[string]any, main bool) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range data {
		key, ok := mimeKeys[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if s, isStr := v.(string); isStr {
			if key == "text" && len(s) >= 2 && strings.HasPrefix(s, "'") && strings.HasSuffix(s, "'") {
				s = s[1 : len(s)-1] // a Python str's repr: the SDK shows the text itself
			}
			if key == "png" || key == "jpeg" {
				s = strings.TrimSpace(s) // base64 with the kernel's line breaks removed below
				s = strings.ReplaceAll(s, "\n", "")
			}
			v = s
		}
		out[key] = v
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// lineWriter writes one JSON object per line and flushes it, so each reaches the client as it
// is produced (the SDK decodes every network chunk on its own).
type lineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (l lineWriter) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = l.w.Write(append(b, '\n'))
	_ = l.rc.Flush()
}

func (l lineWriter) fail(name, value string) {
	l.write(map[string]any{"type": "error", "name": name, "value": value, "traceback": ""})
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := decodeBody(r, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Code == nil {
		http.Error(w, "code is required", http.StatusBadRequest)
		return
	}
	req.token = r.Header.Get("X-Access-Token")
	if req.ContextID != "" && req.Language != "" {
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	}
	var c *kcontext
	if req.ContextID != "" {
		if c = s.lookup(req.ContextID); c == nil {
			http.Error(w, fmt.Sprintf("Context %s not found", req.ContextID), http.StatusNotFound)
			return
		}
	}
	// From here the answer is a stream: headers go out at once, failures are error lines.
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	out := lineWriter{w: w, rc: http.NewResponseController(w)}
	_ = out.rc.Flush()
	defer out.write(map[string]any{"type": "end_of_execution"})
	ctx := r.Context()
	if c == nil {
		lang := normalize(req.Language)
		var err error
		if c, err = s.defaultContext(ctx, lang); err != nil {
			var nl errNoLanguage
			if errors.As(err, &nl) {
				out.fail("LanguageNotAvailable", fmt.Sprintf("%v (available: %s)", err, s.available()))
				return
			}
			out.fail("ContextError", err.Error())
			return
		}
	}
	// One execution at a time per context; a client that gives up while queued leaves.
	locked := make(chan struct{})
	go func() { c.run.Lock(); close(locked) }()
	select {
	case <-locked:
	case <-ctx.Done():
		go func() { <-locked; c.run.Unlock() }()
		s.log.Info("the client left before its execution ran", "context", c.ID, "err", context.Cause(ctx))
		return
	}
	defer c.run.Unlock()
	if ctx.Err() != nil {
		// The client left while the kernel started or the lock came free: nothing to run for. Its
		// answer is end_of_execution alone, which a client still reading takes for a cell without
		// a value (issue 22 item 7, when ingress dropped the guest's side of the request).
		s.log.Info("the client left before its execution ran", "context", c.ID, "err", context.Cause(ctx))
		return
	}
	s.runIn(ctx, c, req, out)
}

// runIn runs req in c and streams what it produces.
func (s *Server) runIn(ctx context.Context, c *kcontext, req executeRequest, out lineWriter) {
	k, restarted, err := s.kernelFor(ctx, c)
	switch {
	case errors.Is(err, errRemoved):
		out.fail("ContextRestarting", "Context was removed")
		return
	case err != nil && ctx.Err() != nil:
		return // the client left while the kernel started
	case err != nil:
		out.fail("ContextError", fmt.Sprintf("the context has no kernel and a new one did not start: %v", err))
		return
	}
	// A restart or removal of the context ends this execution.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-restarted:
			cancel()
		case <-ctx.Done():
		}
	}()
	lang := s.opts.Languages[c.Language]
	s.exportSandboxEnv(ctx, c, k, lang, req.token)
	restore := ""
	for k := range req.EnvVars {
		// Names go into each language's code (bash's unquoted): only what a shell accepts.
		if !envNameRe.MatchString(k) {
			out.fail("EnvVarsError", fmt.Sprintf("invalid environment variable name %q: use letters, digits and '_', not starting with a digit", k))
			return
		}
	}
	if len(req.EnvVars) > 0 && lang.SetEnv != nil {
		set, undo := lang.SetEnv(req.EnvVars)
		if rep, err := k.Execute(ctx, set, true, func(jupyter.Output) {}); err != nil || rep.Status != "ok" {
			out.fail("EnvVarsError", fmt.Sprintf("could not set the execution's environment variables (%v)", err))
			return
		}
		restore = undo
	}
	errSent := false
	// What went out, for the log: a value the client says it did not get is told apart from one
	// the kernel never gave (issue 22 item 7).
	sent := map[string]int{}
	rep, err := k.Execute(ctx, *req.Code, false, func(o jupyter.Output) {
		sent[o.Kind]++
		switch o.Kind {
		case "count":
			out.write(map[string]any{"type": "number_of_executions", "execution_count": o.Count})
		case "stream":
			typ := "stdout"
			if o.Stream == "stderr" {
				typ = "stderr"
			}
			out.write(map[string]any{"type": typ, "text": o.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
		case "result":
			out.write(result(o.Data, o.Main))
		case "error":
			errSent = true
			out.write(map[string]any{"type": "error", "name": o.EName, "value": o.EValue, "traceback": strings.Join(o.Traceback, "\n")})
		}
	})
	s.log.Info("execution ended", "context", c.ID, "language", c.Language, "status", rep.Status, "count", rep.Count,
		"interrupted", rep.Interrupted, "err", err, "results", sent["result"], "streams", sent["stream"], "errors", sent["error"])
	select {
	case <-restarted:
		out.fail("ContextRestarting", "Context was restarted")
		return
	default:
	}
	if broken(err) {
		if errors.Is(err, jupyter.ErrDied) {
			out.fail("KernelDied", fmt.Sprintf("the %s kernel exited while running this code (%v); its state is lost and it is being restarted", c.Language, k.ExitErr()))
		} else {
			out.fail("KernelUnresponsive", fmt.Sprintf("the %s kernel did not stop within %v of an interrupt; its state is lost and it is being restarted", c.Language, jupyter.InterruptGrace))
		}
		s.renew(ctx, c, k)
		return
	}
	switch {
	case err != nil && !errSent:
		out.fail("ExecutionError", err.Error())
	case err == nil && rep.Status == "aborted" && !rep.Interrupted:
		out.fail("ExecutionAborted", "Execution was aborted")
	case err == nil && rep.Interrupted && rep.Status != "ok" && !errSent:
		// The kernel stopped without a word of its own (ipykernel caught the interrupt outside
		// the cell): the client left, or a proxy told this side it did while the client still
		// reads (issue 22 item 7); that client must not take the cell for one without a value.
		out.fail("ExecutionInterrupted", "the execution was interrupted before the kernel finished it: the service saw its client leave or its timeout pass")
	}
	// Also after an interrupt (the client left): the kernel is idle again and keeps no variable
	// of this execution. Bounded, as a kernel that is idle answers at once.
	if restore != "" {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), jupyter.InterruptGrace)
		rrep, rerr := k.Execute(rctx, restore, true, func(jupyter.Output) {})
		rcancel()
		if rerr != nil || rrep.Status != "ok" {
			s.log.Warn("restore environment after an execution", "context", c.ID, "err", rerr, "status", rrep.Status)
		}
		if broken(rerr) {
			s.renew(ctx, c, k)
		}
	}
}

// exportSandboxEnv gives kernel k the sandbox's variables (Sandbox.create's envs), once per
// kernel: kernels restored with the template's started snapshot began before the sandbox had any,
// and a restarted kernel starts from the service's environment. A failure is logged and tried
// again at the next execution; the execution itself goes on. The caller holds c.run.
func (s *Server) exportSandboxEnv(ctx context.Context, c *kcontext, k kernel, lang Language, token string) {
	if s.opts.SandboxEnv == nil || lang.ExportEnv == nil || c.envKernel == k {
		return
	}
	env, err := s.opts.SandboxEnv(ctx, token)
	if err != nil {
		s.log.Warn("read the sandbox's environment variables", "context", c.ID, "err", err)
		return
	}
	for name := range env {
		// Names go into each language's code (bash's unquoted): envd takes any, the kernels not.
		if !envNameRe.MatchString(name) {
			s.log.Warn("a sandbox environment variable's name cannot be set in a kernel", "name", name)
			delete(env, name)
		}
	}
	if len(env) > 0 {
		rep, err := k.Execute(ctx, lang.ExportEnv(env), true, func(jupyter.Output) {})
		if err != nil || rep.Status != "ok" {
			s.log.Warn("set the sandbox's environment variables in a kernel", "context", c.ID, "err", err, "status", rep.Status)
			return
		}
	}
	c.envKernel = k
}

// broken says whether an execution's error leaves its kernel unusable: exited, or deaf to
// interrupts.
func broken(err error) bool {
	return errors.Is(err, jupyter.ErrDied) || errors.Is(err, jupyter.ErrStuck)
}

// renew restarts c after its kernel k died or stopped answering, while the execution still holds
// the context, so the next one finds a fresh kernel; unless c has moved on from k already.
func (s *Server) renew(ctx context.Context, c *kcontext, k kernel) {
	c.kmu.Lock()
	current := c.kernel == k
	c.kmu.Unlock()
	if !current {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
	defer cancel()
	if err := s.restart(rctx, c); err != nil && !errors.Is(err, errRemoved) {
		// The context is left without a kernel; its next execution tries again.
		s.log.Error("restart a kernel that died or stopped answering", "context", c.ID, "err", err)
	}
}
