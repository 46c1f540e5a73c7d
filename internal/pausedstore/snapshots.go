package pausedstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/keylock"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/snapshot"
)

// SnapshotRef is the store's ref of snapshot id.
func SnapshotRef(id string) string { return "snapshots/" + id }

// SnapshotNode is the part of a node whose snapshots are shared.
type SnapshotNode interface {
	CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error)
	DeleteSnapshot(ctx context.Context, snapID string) error
	SnapshotDir(snapID string) (string, error)
}

// Snapshots shares a node's snapshots (named ones, and the checkpoints forks start from) through
// the store. A snapshot stays on the node that took it until another node needs it: the driver
// asks the holder to publish it, and the other node fetches it, with the template build it
// stacks on, before it starts a sandbox from it. Deleting a snapshot deletes the store's copy
// too. Sandboxes forked from a paused sandbox still start on that sandbox's node.
type Snapshots struct {
	node      SnapshotNode
	store     Store
	templates Templates
	log       *slog.Logger
	// locks orders a snapshot's publish, fetch and delete here.
	locks keylock.Map
}

// NewSnapshots shares n's snapshots through store.
func NewSnapshots(n SnapshotNode, store Store, templates Templates, log *slog.Logger) *Snapshots {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Snapshots{node: n, store: store, templates: templates, log: log}
}

// PublishSnapshot puts snapshot id, which this node holds, in the store unless it is there.
func (s *Snapshots) PublishSnapshot(ctx context.Context, id string) error {
	dir, err := s.node.SnapshotDir(id)
	if err != nil {
		return err
	}
	unlock := s.locks.Lock(id)
	defer unlock()
	if _, err := s.store.Resolve(ctx, SnapshotRef(id)); err == nil {
		return nil
	} else if !errors.Is(err, artifacts.ErrNotFound) {
		return fmt.Errorf("look for snapshot %s in the store: %w", id, err)
	}
	if _, err := snapshot.Read(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) || errdefs.Is(err, errdefs.KindNotFound) {
			return errdefs.NotFound("snapshot %q is not on this node", id)
		}
		return err
	}
	st, err := s.store.Push(ctx, SnapshotRef(id), dir)
	if err != nil {
		return fmt.Errorf("put snapshot %s in the store: %w", id, err)
	}
	s.log.Info("snapshot in the store", "snapshot", id, "bytes", st.Bytes, "uploaded", st.UploadedBytes, "took", st.Duration)
	return nil
}

// CreateFromSnapshot starts a sandbox from a snapshot, fetching the snapshot from the store
// first when this node does not hold it. A node that has it nowhere answers NotFound.
func (s *Snapshots) CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error) {
	if pausedID == "" {
		if err := s.fetch(ctx, snapID); err != nil {
			return node.Info{}, err
		}
	}
	return s.node.CreateFromSnapshot(ctx, spec, snapID, pausedID)
}

func (s *Snapshots) fetch(ctx context.Context, id string) error {
	dir, err := s.node.SnapshotDir(id)
	if err != nil {
		return err
	}
	unlock := s.locks.Lock(id)
	defer unlock()
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	st, err := s.store.Pull(ctx, SnapshotRef(id), dir)
	if errors.Is(err, artifacts.ErrNotFound) {
		return errdefs.NotFound("snapshot %q is neither on this node nor in the store", id)
	}
	if err != nil {
		return fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	s.log.Info("snapshot fetched from the store", "snapshot", id, "bytes", st.Bytes, "fetched", st.FetchedBytes, "took", st.Duration)
	if err := stackOnTemplate(ctx, dir, s.templates); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	return nil
}

// DeleteSnapshot deletes snapshot id here and in the store.
func (s *Snapshots) DeleteSnapshot(ctx context.Context, id string) error {
	unlock := s.locks.Lock(id)
	defer unlock()
	err := s.node.DeleteSnapshot(ctx, id)
	if derr := s.store.Delete(ctx, SnapshotRef(id)); derr != nil && !errors.Is(derr, artifacts.ErrNotFound) {
		err = errors.Join(err, fmt.Errorf("delete snapshot %s from the store: %w", id, derr))
	}
	return err
}
