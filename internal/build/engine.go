// Package build runs template builds on a node: it turns a base (an OCI image or another
// template) and a list of steps into a stack of read-only layers, one per step that changes
// files, and records the result as a template build manifest. Each step's result is cached under
// the content hash of (parent state, step, uploaded files), so an unchanged prefix of a build is
// reused. RUN steps and the start/ready check run inside build sandboxes of the node's runtime;
// COPY, WORKDIR and image provisioning write on the host through an overlay no sandbox uses.
//
// It owns <data-dir>/layers, build-cache, build-files, build-scratch and build-logs. It never
// modifies a published layer, never touches sandbox directories, and never decides which build a
// template name points at (the driver does).
package build

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/fsroot"
	"github.com/vibemon/vmon/internal/oci"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/template"
)

// SandboxSpec describes a build sandbox.
type SandboxSpec struct {
	// Lowers are absolute layer directories, topmost first.
	Lowers         []string
	CPUs, MemoryMB int
	Env            map[string]string
	// Start marks the finalize step's start check, whose sandbox may become the template's
	// started snapshot: the node boots it as it boots the template's sandboxes.
	Start bool
}

// Sandbox is a running build sandbox (node.BuildSandbox).
type Sandbox interface {
	Run(ctx context.Context, script, user, cwd string, env map[string]string, out func(stderr bool, data []byte)) (int, error)
	CheckStart(ctx context.Context, start, ready, user, cwd string, timeout time.Duration, attempt func(exit int, output []byte)) error
	Commit(ctx context.Context, dst string) error
	Discard(ctx context.Context) error
}

// StartCheckpointer is implemented by build sandboxes that can save themselves, start command
// running, as the snapshot every sandbox of the template is restored from. CheckpointStart
// creates dir and ends the sandbox, as Discard does.
type StartCheckpointer interface {
	CheckpointStart(ctx context.Context, dir string) error
}

// Sandboxes starts build sandboxes (the node).
type Sandboxes interface {
	StartBuild(ctx context.Context, spec SandboxSpec) (Sandbox, error)
}

// Images fetches OCI images (*oci.Puller).
type Images interface {
	Resolve(ctx context.Context, ref string, creds *oci.Credentials) (*oci.Image, error)
	Unpack(ctx context.Context, img *oci.Image, dir string, progress func(string)) error
}

// Mounter stacks layers into a writable root on the host (internal/rootfs).
type Mounter interface {
	Prepare(ctx context.Context, lowers []string, dir string) (string, error)
	Commit(ctx context.Context, dir, dst string) error
	Release(ctx context.Context, dir string) error
}

// Options configure an Engine.
type Options struct {
	DataDir   string
	Images    Images
	Sandboxes Sandboxes
	Mounts    Mounter
	Files     *Files
	// ReadyTimeout bounds the start/ready check of a build.
	ReadyTimeout time.Duration
	// NoStartSnapshot keeps templates with a start command from being saved started: every
	// sandbox then runs the start command (benchmarks compare both paths).
	NoStartSnapshot bool
	// EnvdBuild names the envd build sandboxes run. A started snapshot holds that envd's
	// process, so it is part of the start step's cache key: after an upgrade a rebuild saves the
	// template with the new envd instead of reusing the old snapshot.
	EnvdBuild string
	// StartOn names how the node boots start checks ("" for an overlay; with root images, the
	// image and disk size its snapshot restores with). It is part of the start step's cache key:
	// a node that changed it checks the start command again on a rebuild, and saves the
	// snapshot the new way.
	StartOn string
	Log     *slog.Logger
}

// Engine runs builds.
type Engine struct {
	opts  Options
	cache cache
}

// New returns an engine and removes what a crashed build left behind.
func New(o Options) (*Engine, error) {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{opts: o, cache: cache{dataDir: o.DataDir}}
	if err := e.cache.sweep(); err != nil {
		return nil, fmt.Errorf("sweep unfinished layers: %w", err)
	}
	if err := e.sweepScratch(context.Background()); err != nil {
		return nil, fmt.Errorf("sweep build scratch: %w", err)
	}
	return e, nil
}

// StepError is a failed build: which step ("base", "finalize" or its 1-based number) and why.
type StepError struct {
	Step string
	Msg  string
	// Cause is the internal error, for the server's log only.
	Cause error
}

func (e *StepError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("step %s: %s: %v", e.Step, e.Msg, e.Cause)
	}
	return fmt.Sprintf("step %s: %s", e.Step, e.Msg)
}

func stepErr(step string, err error, format string, args ...any) *StepError {
	msg := fmt.Sprintf(format, args...)
	if err != nil && errdefs.KindOf(err) != errdefs.KindUnknown {
		msg += ": " + errdefs.PublicMessage(err)
		err = nil
	}
	return &StepError{Step: step, Msg: msg, Cause: err}
}

// Run performs req, logging to log, and writes the build's manifest. Any failure is a
// *StepError; nothing of a failed build becomes visible (layers it published are only cache).
func (e *Engine) Run(ctx context.Context, req Request, log *Log) (template.Manifest, error) {
	start := time.Now()
	if err := req.Validate(); err != nil {
		return template.Manifest{}, stepErr("base", err, "invalid build")
	}
	state, key, err := e.base(ctx, req, log)
	if err != nil {
		return template.Manifest{}, err
	}
	cached := 0
	for i, s := range req.Steps {
		step := strconv.Itoa(i + 1)
		k := s.key(key)
		if s.Force || req.Force {
			// A forced step must not reuse, nor be reused by, the cached result: a fresh key
			// also rebuilds every step after it.
			k = s.key(key + "|force|" + req.BuildID)
		}
		log.Add("info", step, "[%d/%d] %s", i+1, len(req.Steps), s.describe())
		if st, ok := e.cache.get(k); ok {
			log.Add("info", step, "CACHED [%d/%d] %s", i+1, len(req.Steps), s.describe())
			state, key = st, k
			cached++
			continue
		}
		t0 := time.Now()
		st, err := e.apply(ctx, req, state, s, k, step, log)
		if err != nil {
			return template.Manifest{}, err
		}
		if err := e.cache.put(k, st); err != nil {
			return template.Manifest{}, stepErr(step, err, "record the step's result")
		}
		log.Add("info", step, "done in %.1fs", time.Since(t0).Seconds())
		state, key = st, k
	}
	fkey := []string{key, "finalize", req.StartCmd, req.ReadyCmd, e.opts.EnvdBuild}
	if e.opts.StartOn != "" { // keys made before StartOn stay valid for overlays
		fkey = append(fkey, e.opts.StartOn)
	}
	m, err := e.finalize(ctx, req, state, hashKey(fkey...), log)
	if err != nil {
		return template.Manifest{}, err
	}
	m.BuildSeconds = time.Since(start).Seconds()
	if err := template.WriteBuild(e.opts.DataDir, m); err != nil {
		return template.Manifest{}, stepErr("finalize", err, "record the build")
	}
	log.Add("info", "finalize", "build %s ready in %.1fs (%d of %d steps cached)", req.BuildID, m.BuildSeconds, cached, len(req.Steps))
	return m, nil
}

// base produces the state the steps start from: a pulled and provisioned image, or a template.
func (e *Engine) base(ctx context.Context, req Request, log *Log) (State, string, error) {
	if p := req.FromTemplate; p != nil {
		log.Add("info", "base", "FROM template %s (build %s)", p.TemplateID, p.BuildID)
		st := State{Layers: p.Layers, Env: p.Env, User: p.User, Workdir: p.Workdir}
		if st.User == "" {
			st.User = DefaultUser
		}
		return st.clone(), hashKey("template", p.TemplateID, p.BuildID), nil
	}
	log.Add("info", "base", "FROM %s", req.FromImage)
	var creds *oci.Credentials
	if r := req.FromImageRegistry; r != nil {
		creds = &oci.Credentials{Username: r.Username, Password: r.Password}
	}
	img, err := e.opts.Images.Resolve(ctx, req.FromImage, creds)
	if err != nil {
		return State{}, "", stepErr("base", err, "cannot get image %q", req.FromImage)
	}
	log.Add("info", "base", "resolved %s to %s", req.FromImage, img.Digest)
	imgKey := hashKey("image", img.Digest)
	if req.Force {
		imgKey = hashKey("image", img.Digest, "force", req.BuildID)
	}
	provKey := hashKey(imgKey, provisionVersion)
	if st, ok := e.cache.get(provKey); ok {
		log.Add("info", "base", "CACHED image %s", img.Digest)
		return st, provKey, nil
	}
	imgLayer, err := e.layer(imgKey, func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		return e.opts.Images.Unpack(ctx, img, dir, func(line string) { log.Add("info", "base", "%s", line) })
	})
	if err != nil {
		return State{}, "", stepErr("base", err, "cannot unpack image %q", req.FromImage)
	}
	st := State{Layers: []string{imgLayer}, Env: map[string]string{}, User: img.Config.User, Workdir: img.Config.WorkingDir}
	for _, kv := range img.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			st.Env[k] = v
		}
	}
	if st.User == "" {
		st.User = DefaultUser
	}
	if st.Workdir == "" {
		st.Workdir = "/"
		if st.User == DefaultUser {
			st.Workdir = "/home/" + DefaultUser
		}
	}
	log.Add("info", "base", "provisioning the image (user %q, envd)", DefaultUser)
	provLayer, err := e.layer(provKey, func(dir string) error {
		return e.onMerged(ctx, st.Layers, dir, func(root *fsroot.Root) error {
			if err := provision(root, func(f string, a ...any) { log.Add("info", "base", f, a...) }); err != nil {
				return err
			}
			// Steps and sandboxes start in the workdir, so it must exist.
			uid, gid, err := lookupUser(root, st.User)
			if err != nil {
				uid, gid = 0, 0
			}
			return root.MkdirAll(st.Workdir, 0o755, uid, gid)
		})
	})
	if err != nil {
		return State{}, "", stepErr("base", err, "cannot provision image %q", req.FromImage)
	}
	st.Layers = []string{provLayer, imgLayer}
	if err := e.cache.put(provKey, st); err != nil {
		return State{}, "", stepErr("base", err, "record the image")
	}
	return st, provKey, nil
}

// apply runs one uncached step on state and returns the state after it.
func (e *Engine) apply(ctx context.Context, req Request, state State, s Step, key, step string, log *Log) (State, error) {
	next := state.clone()
	switch strings.ToUpper(s.Type) {
	case "ENV":
		for i := 0; i+1 < len(s.Args); i += 2 {
			next.Env[s.Args[i]] = s.Args[i+1]
		}
		return next, nil
	case "USER":
		next.User = s.Args[0]
		return next, nil
	}
	if len(state.Layers) >= rootfs.MaxLowers {
		return State{}, stepErr(step, nil, "too many layers (at most %d): merge RUN steps", rootfs.MaxLowers)
	}
	var err error
	var layer string
	switch strings.ToUpper(s.Type) {
	case "RUN":
		layer, err = e.run(ctx, req, state, s, key, step, log)
	case "COPY":
		layer, err = e.copy(ctx, req, state, s, key, step)
	case "WORKDIR":
		next.Workdir = resolveDir(state.Workdir, s.Args[0])
		layer, err = e.layer(key, func(dir string) error {
			return e.onMerged(ctx, state.Layers, dir, func(root *fsroot.Root) error {
				uid, gid, err := lookupUser(root, state.User)
				if err != nil {
					return err
				}
				return root.MkdirAll(next.Workdir, 0o755, uid, gid)
			})
		})
		if err != nil {
			err = stepErr(step, err, "cannot create %s", next.Workdir)
		}
	}
	if err != nil {
		return State{}, err
	}
	next.Layers = append([]string{layer}, state.Layers...)
	return next, nil
}

// run executes a RUN step in a build sandbox and returns the layer of what it wrote.
func (e *Engine) run(ctx context.Context, req Request, state State, s Step, key, step string, log *Log) (string, error) {
	user := state.User
	if len(s.Args) > 1 && s.Args[1] != "" {
		user = s.Args[1]
	}
	sb, err := e.opts.Sandboxes.StartBuild(ctx, SandboxSpec{Lowers: e.absLayers(state.Layers),
		CPUs: req.CPUs, MemoryMB: req.MemoryMB, Env: state.Env})
	if err != nil {
		return "", stepErr(step, err, "cannot start the build sandbox")
	}
	stdout := &lineWriter{log: log, step: step, level: "info"}
	stderr := &lineWriter{log: log, step: step, level: "info"}
	exit, err := sb.Run(ctx, s.Args[0], user, state.Workdir, nil, func(isErr bool, b []byte) {
		if isErr {
			stderr.write(b)
		} else {
			stdout.write(b)
		}
	})
	stdout.flush()
	stderr.flush()
	if err == nil && exit != 0 {
		_ = sb.Discard(ctx)
		tail := append(append([]string{}, stdout.tail...), stderr.tail...)
		if len(tail) > 10 {
			tail = tail[len(tail)-10:]
		}
		msg := fmt.Sprintf("command %q exited with code %d", s.Args[0], exit)
		if len(tail) > 0 {
			msg += ": " + strings.Join(tail, "\n")
		}
		return "", &StepError{Step: step, Msg: msg}
	}
	if err != nil {
		_ = sb.Discard(ctx)
		return "", stepErr(step, err, "command %q failed (as user %q)", s.Args[0], user)
	}
	layer, err := e.layer(key, func(dir string) error { return sb.Commit(ctx, dir) })
	if err != nil {
		return "", stepErr(step, err, "cannot save the step's files")
	}
	return layer, nil
}

// copy applies a COPY step on the host and returns the layer of the copied files.
func (e *Engine) copy(ctx context.Context, req Request, state State, s Step, key, step string) (string, error) {
	f, err := e.opts.Files.Open(ctx, req.TemplateID, s.FilesHash)
	if err != nil {
		return "", stepErr(step, err, "COPY %s", s.Args[0])
	}
	defer f.Close()
	dest := s.Args[1]
	c := copySpec{src: s.Args[0], dest: resolveDir(state.Workdir, dest), destDir: strings.HasSuffix(dest, "/")}
	userSpec := state.User
	if len(s.Args) > 2 && s.Args[2] != "" {
		userSpec = s.Args[2]
	}
	if len(s.Args) > 3 && s.Args[3] != "" {
		m, _ := parseMode(s.Args[3])
		mode := os.FileMode(m & 0o777)
		if m&0o4000 != 0 {
			mode |= os.ModeSetuid
		}
		if m&0o2000 != 0 {
			mode |= os.ModeSetgid
		}
		if m&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		c.mode = &mode
	}
	var n int
	layer, err := e.layer(key, func(dir string) error {
		return e.onMerged(ctx, state.Layers, dir, func(root *fsroot.Root) error {
			uid, gid, err := lookupUser(root, userSpec)
			if err != nil {
				return err
			}
			c.uid, c.gid = uid, gid
			n, err = applyCopy(root, f, c)
			return err
		})
	})
	if err != nil {
		return "", stepErr(step, err, "COPY %s %s", s.Args[0], dest)
	}
	_ = n
	return layer, nil
}

// finalize checks the template's user and start/ready commands and returns its manifest.
func (e *Engine) finalize(ctx context.Context, req Request, state State, key string, log *Log) (template.Manifest, error) {
	user := state.User
	err := e.onMerged(ctx, state.Layers, "", func(root *fsroot.Root) error {
		uid, _, err := lookupUser(root, user)
		if err != nil {
			return err
		}
		// envd runs processes by user name; a numeric USER becomes the name it has.
		if _, err := strconv.Atoi(strings.SplitN(user, ":", 2)[0]); err == nil {
			users, _ := readPasswd(root)
			name := ""
			for _, u := range users {
				if u.uid == uid {
					name = u.name
					break
				}
			}
			if name == "" {
				return errdefs.InvalidArgument("user %q has no name in /etc/passwd", user)
			}
			user = name
		}
		user = strings.SplitN(user, ":", 2)[0]
		if st, err := root.Stat(state.Workdir); err != nil || st.Mode&0o170000 != 0o040000 {
			return errdefs.InvalidArgument("workdir %s does not exist", state.Workdir)
		}
		return nil
	})
	if err != nil {
		return template.Manifest{}, stepErr("finalize", err, "invalid template")
	}
	cached, checked := e.cache.get(key)
	hasStart := req.StartCmd != "" || req.ReadyCmd != ""
	// A check cached without a started snapshot (saved with snapshots off, or its checkpoint
	// failed) is done again while they are on; with them off, a cached snapshot is not used.
	if checked && hasStart && cached.StartSnapshot == "" && !e.opts.NoStartSnapshot {
		checked = false
	}
	startSnapshot := ""
	if checked && !req.Force {
		log.Add("info", "finalize", "CACHED start command %q with ready command %q", req.StartCmd, req.ReadyCmd)
		if !e.opts.NoStartSnapshot {
			startSnapshot = cached.StartSnapshot
		}
	} else if hasStart {
		log.Add("info", "finalize", "checking start command %q with ready command %q (up to %s)", req.StartCmd, req.ReadyCmd, e.opts.ReadyTimeout)
		sb, err := e.opts.Sandboxes.StartBuild(ctx, SandboxSpec{Lowers: e.absLayers(state.Layers),
			CPUs: req.CPUs, MemoryMB: req.MemoryMB, Env: state.Env, Start: true})
		if err != nil {
			return template.Manifest{}, stepErr("finalize", err, "cannot start the build sandbox")
		}
		attempts := 0
		err = sb.CheckStart(ctx, req.StartCmd, req.ReadyCmd, user, state.Workdir, e.opts.ReadyTimeout, func(exit int, out []byte) {
			attempts++
			if attempts <= 3 || attempts%20 == 0 {
				log.Add("info", "finalize", "ready command not ready yet (attempt %d, exit code %d) %s", attempts, exit, strings.TrimSpace(string(out)))
			}
		})
		if err != nil {
			_ = sb.Discard(ctx)
			return template.Manifest{}, &StepError{Step: "finalize", Msg: err.Error()}
		}
		log.Add("info", "finalize", "start command is ready")
		startSnapshot = e.checkpointStart(ctx, sb, key, log)
		state.StartSnapshot = startSnapshot
		if err := e.cache.put(key, state); err != nil {
			return template.Manifest{}, stepErr("finalize", err, "record the start check")
		}
	}
	return template.Manifest{
		ID: req.TemplateID, BuildID: req.BuildID, Layers: state.Layers, Env: state.Env,
		CPUs: req.CPUs, MemoryMB: req.MemoryMB, DefaultUser: user, DefaultWorkdir: state.Workdir,
		StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, StartSnapshot: startSnapshot, BuiltAt: time.Now().UTC(),
	}, nil
}

// checkpointStart saves the checked build sandbox, start command running, as the template's
// started snapshot and returns where it went (relative to the data dir); "" when the sandbox
// cannot be saved, in which case every sandbox runs the start command itself. It always ends sb.
func (e *Engine) checkpointStart(ctx context.Context, sb Sandbox, key string, log *Log) string {
	cp, ok := sb.(StartCheckpointer)
	if !ok || e.opts.NoStartSnapshot {
		_ = sb.Discard(ctx)
		return ""
	}
	began := time.Now()
	rel, err := e.layer(key, func(dir string) error { return cp.CheckpointStart(ctx, dir) })
	if err != nil {
		log.Add("info", "finalize", "could not save the started sandbox (%v); each sandbox will run the start command", err)
		return ""
	}
	log.Add("info", "finalize", "saved the started sandbox in %s: sandboxes start from it with the start command running",
		time.Since(began).Round(time.Millisecond))
	return rel
}

func (e *Engine) absLayers(rel []string) []string {
	out := make([]string, len(rel))
	for i, l := range rel {
		out[i] = filepath.Join(e.opts.DataDir, l)
	}
	return out
}

// layer builds the layer for key with fill (which creates the directory it is given) and
// publishes it.
func (e *Engine) layer(key string, fill func(dir string) error) (string, error) {
	tmp, err := e.cache.staging(key)
	if err != nil {
		return "", err
	}
	if err := fill(tmp); err != nil {
		_ = rootfs.RemoveTree(tmp)
		return "", err
	}
	return e.cache.publish(key, tmp)
}

const scratchDir = "build-scratch"

// onMerged mounts lowers with a fresh upper layer on the host, runs fn on the merged root, and
// moves the upper layer to commitTo (or drops it when commitTo is "").
func (e *Engine) onMerged(ctx context.Context, lowers []string, commitTo string, fn func(*fsroot.Root) error) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	dir := filepath.Join(e.opts.DataDir, scratchDir, hex.EncodeToString(b[:]))
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	merged, err := e.opts.Mounts.Prepare(ctx, e.absLayers(lowers), dir)
	if err != nil {
		return err
	}
	defer func() {
		_ = e.opts.Mounts.Release(context.WithoutCancel(ctx), dir)
		_ = os.RemoveAll(dir)
	}()
	root, err := fsroot.Open(merged)
	if err != nil {
		return err
	}
	err = fn(root)
	root.Close()
	if err != nil || commitTo == "" {
		return err
	}
	return e.opts.Mounts.Commit(ctx, dir, commitTo)
}

func (e *Engine) sweepScratch(ctx context.Context) error {
	base := filepath.Join(e.opts.DataDir, scratchDir)
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ent := range ents {
		dir := filepath.Join(base, ent.Name())
		if err := e.opts.Mounts.Release(ctx, dir); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, rootfs.RemoveTree(dir))
	}
	return errors.Join(errs...)
}
