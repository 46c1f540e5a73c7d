// Package pausedstore carries paused sandboxes and snapshots between the nodes of a cluster
// through the shared artifact store (internal/artifacts), so that a sandbox paused on one node
// resumes on any other.
//
// A paused sandbox is one ref, paused/<id>, pointing at the tree of its snapshot (files, memory,
// the manifest naming its template build). The node that pauses a sandbox pushes it before the
// pause is answered, so a record that says "paused" always has its latest state in the store; the
// node that resumes it (the same one, warm, or another that pulls it first) removes the ref. A
// node only ever removes the ref when it still points at the copy that node holds: a node that
// drops a stale copy of a sandbox that has since run and paused elsewhere leaves the newer one
// alone.
//
// Snapshots (snapshots.go) travel the same way, as snapshots/<id>, but only when another node
// needs one: the node that took it publishes it when the driver asks.
//
// It wraps a node's pause, resume, delete and start from a snapshot, and never touches running
// sandboxes, templates' contents or the driver's records.
package pausedstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/atomicfile"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/keylock"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/template"
)

// Store is the artifact store as this package uses it (*artifacts.Store).
type Store interface {
	Push(ctx context.Context, ref, dir string) (artifacts.PushStats, error)
	Pull(ctx context.Context, ref, dir string) (artifacts.PullStats, error)
	Resolve(ctx context.Context, ref string) (artifacts.RefInfo, error)
	Delete(ctx context.Context, ref string) error
}

// Node is the part of a node whose paused sandboxes are carried.
type Node interface {
	PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error)
	ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error)
	DeletePaused(ctx context.Context, id string) error
	// Settled waits until what a pause does in the background is done: the paused sandbox's
	// directory is then whole.
	Settled(ctx context.Context, id string) error
	// PausedDir is where the node keeps paused sandbox id.
	PausedDir(id string) string
}

// Templates fetches a template build the node lacks (tplstore.Sync.Fetch).
type Templates func(ctx context.Context, id, build string) (template.Manifest, error)

// stackOnTemplate brings the template build the snapshot in dir (fetched from another node)
// stacks on, and points the snapshot at that build's layers as this node names them: a template
// built from steps has other layer names on each node that fetched it.
func stackOnTemplate(ctx context.Context, dir string, templates Templates) error {
	meta, err := snapshot.Read(dir)
	if err != nil || templates == nil {
		return err
	}
	tm, err := templates(ctx, meta.TemplateID, meta.BuildID)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return nil // a template only this node has, or gone: the layers are what they are
	}
	if err != nil {
		return fmt.Errorf("template %s of snapshot %s: %w", meta.TemplateID, filepath.Base(dir), err)
	}
	if len(tm.Layers) > 0 && !slices.Equal(tm.Layers, meta.Lowers) {
		return snapshot.SetLowers(dir, tm.Layers)
	}
	return nil
}

// pushMargin is what a pause keeps of its caller's deadline to answer in once its push gave up.
const pushMargin = 10 * time.Second

// Ref is the store's ref of paused sandbox id.
func Ref(id string) string { return "paused/" + id }

// Carrier pauses, resumes and deletes a node's sandboxes with their copies in the store.
type Carrier struct {
	node      Node
	store     Store
	templates Templates
	// originDir keeps, per paused sandbox held here, the digest of the store's copy it matches
	// (pushed from here or pulled into here).
	originDir string
	log       *slog.Logger
	// locks orders a sandbox's pause, resume and delete here, so that a push of its copy is
	// never overtaken by a resume of it.
	locks keylock.Map
	// pausing counts pauses whose copy is still on its way to the store.
	pausing atomic.Int32
}

// Pausing is how many pauses are not done yet (their copies on the way to the store): a node
// that stops waits for them.
func (c *Carrier) Pausing() int {
	if c == nil {
		return 0
	}
	return int(c.pausing.Load())
}

// New returns a Carrier for n; stateDir keeps what it needs across restarts.
func New(n Node, store Store, templates Templates, stateDir string, log *slog.Logger) (*Carrier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Join(stateDir, "paused-origins")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("paused sandboxes' store state: %w", err)
	}
	c := &Carrier{node: n, store: store, templates: templates, originDir: dir, log: log}
	c.sweep()
	return c, nil
}

// sweep forgets the origins of copies no longer here (resumed or deleted across a crash).
func (c *Carrier) sweep() {
	ents, err := os.ReadDir(c.originDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id := e.Name()
		if strings.HasPrefix(id, ".") {
			_ = os.Remove(filepath.Join(c.originDir, id))
			continue
		}
		if _, err := os.Stat(c.node.PausedDir(id)); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(filepath.Join(c.originDir, id))
		}
	}
}

// PauseSandbox pauses sandbox id here, then puts its copy in the store: the pause is done when
// the copy is there. A copy that cannot be stored leaves the sandbox paused here, resumable on
// this node only, and no older copy in the store to be taken for it.
func (c *Carrier) PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error) {
	c.pausing.Add(1)
	defer c.pausing.Add(-1)
	unlock := c.locks.Lock(id)
	defer unlock()
	info, err := c.node.PauseSandbox(ctx, id, memory)
	if err != nil {
		return info, err
	}
	// A client that goes away does not cut the push short, but the caller's deadline holds (less
	// a margin to answer in): a pause the driver gave up on would be recorded as still running.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if d, ok := ctx.Deadline(); ok {
		pctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), d.Add(-pushMargin))
	}
	defer cancel()
	if err := c.push(pctx, id); err != nil {
		c.log.Error("a paused sandbox could not be put in the store; it resumes on this node only", "sandbox", id, "err", err)
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), pushMargin)
		defer dcancel()
		if derr := c.store.Delete(dctx, Ref(id)); derr != nil && !errors.Is(derr, artifacts.ErrNotFound) {
			c.log.Error("an older copy of a paused sandbox may still be in the store", "sandbox", id, "err", derr)
		}
		c.forgetOrigin(id)
	}
	return info, nil
}

func (c *Carrier) push(ctx context.Context, id string) error {
	if err := c.node.Settled(ctx, id); err != nil {
		return err
	}
	st, err := c.store.Push(ctx, Ref(id), c.node.PausedDir(id))
	if err != nil {
		return err
	}
	c.log.Info("paused sandbox in the store", "sandbox", id, "bytes", st.Bytes, "uploaded", st.UploadedBytes, "took", st.Duration)
	return c.setOrigin(id, st.Manifest)
}

// ResumeSandbox resumes sandbox id from its copy here, or from the store's (with the template
// build it stacks on) when this node has none. A node that has neither answers NotFound. Once
// the sandbox runs, its copy in the store is spent.
func (c *Carrier) ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error) {
	unlock := c.locks.Lock(spec.ID)
	defer unlock()
	if err := c.fetch(ctx, spec.ID); err != nil {
		return node.Info{}, err
	}
	info, err := c.node.ResumeSandbox(ctx, spec, memory)
	if err != nil {
		return info, err
	}
	c.dropStored(context.WithoutCancel(ctx), spec.ID)
	return info, nil
}

// fetch pulls paused sandbox id from the store unless the node has a copy.
func (c *Carrier) fetch(ctx context.Context, id string) error {
	dir := c.node.PausedDir(id)
	if _, err := os.Stat(dir); err == nil {
		// A copy here is the latest unless the store holds another: a newer pause elsewhere
		// since this node held it.
		ri, err := c.store.Resolve(ctx, Ref(id))
		switch {
		case errors.Is(err, artifacts.ErrNotFound):
			return nil
		case err != nil:
			c.log.Warn("cannot check a paused sandbox's copy here against the store; resuming it", "sandbox", id, "err", err)
			return nil
		case ri.Manifest == c.origin(id):
			return nil
		}
		c.log.Info("dropping a stale copy of a paused sandbox; the store has a newer one", "sandbox", id)
		if err := c.node.DeletePaused(ctx, id); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return fmt.Errorf("drop a stale copy of paused sandbox %s: %w", id, err)
		}
		c.forgetOrigin(id)
	}
	st, err := c.store.Pull(ctx, Ref(id), dir)
	if errors.Is(err, artifacts.ErrNotFound) {
		return errdefs.NotFound("paused sandbox %q is neither on this node nor in the store", id)
	}
	if err != nil {
		return fmt.Errorf("fetch paused sandbox %s: %w", id, err)
	}
	c.log.Info("paused sandbox fetched from the store", "sandbox", id, "bytes", st.Bytes, "fetched", st.FetchedBytes, "took", st.Duration)
	if err := c.setOrigin(id, st.Manifest); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	err = stackOnTemplate(ctx, dir, c.templates)
	if err != nil {
		// Not resumable here after all: no copy stays behind to be taken for the latest later.
		_ = os.RemoveAll(dir)
		c.forgetOrigin(id)
		return err
	}
	return nil
}

// DeletePaused deletes paused sandbox id here, and its copy in the store when that is the one
// this node held.
func (c *Carrier) DeletePaused(ctx context.Context, id string) error {
	unlock := c.locks.Lock(id)
	defer unlock()
	err := c.node.DeletePaused(ctx, id)
	if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		return err
	}
	c.dropStored(ctx, id)
	return err
}

// dropStored removes the store's copy of id if it is the one held here, and forgets the origin.
func (c *Carrier) dropStored(ctx context.Context, id string) {
	origin := c.origin(id)
	if origin == "" {
		return
	}
	defer c.forgetOrigin(id)
	ri, err := c.store.Resolve(ctx, Ref(id))
	if errors.Is(err, artifacts.ErrNotFound) {
		return
	}
	if err != nil {
		c.log.Warn("a spent copy of a paused sandbox stays in the store", "sandbox", id, "err", err)
		return
	}
	if ri.Manifest != origin {
		// A newer pause elsewhere: that copy is not this node's to remove.
		return
	}
	if err := c.store.Delete(ctx, Ref(id)); err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		c.log.Warn("a spent copy of a paused sandbox stays in the store", "sandbox", id, "err", err)
	}
}

func (c *Carrier) origin(id string) string {
	b, err := os.ReadFile(filepath.Join(c.originDir, id))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (c *Carrier) setOrigin(id, digest string) error {
	return atomicfile.Replace(filepath.Join(c.originDir, id), []byte(digest+"\n"), 0o600)
}

func (c *Carrier) forgetOrigin(id string) { _ = os.Remove(filepath.Join(c.originDir, id)) }
