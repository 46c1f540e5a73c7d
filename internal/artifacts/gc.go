package artifacts

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// ErrGCRunning is returned by GC while another GC holds the store.
var ErrGCRunning = errors.New("artifacts: another GC is running")

// GCStats describes a finished GC.
type GCStats struct {
	Refs             int
	Chunks           int // chunks stored before the GC
	Manifests        int
	DeletedChunks    int
	DeletedManifests int
	FreedBytes       int64
	KeptYoung        int // unreferenced but younger than the grace period
	StaleIntents     int // commit intents of dead pushes removed
	StaleTemps       int // a directory backend's temporary files of interrupted writes removed
	Duration         time.Duration
}

// GC deletes the chunks and manifests that no ref reaches and that are older than grace (1 hour
// if 0; a negative grace means none, for tests). The grace keeps the chunks of pushes in flight,
// which reach the backend before their ref does. In order:
//
//  1. It writes the GC state as running (a new generation), refreshed while it runs; a push that
//     reads it does not commit until the GC is over, then re-checks its chunks.
//  2. It waits until no push is between announcing its commit and finishing it: those commits
//     read the state before the GC wrote it, and their refs must be seen by the mark.
//  3. It lists the stored objects, reads every ref and the manifest it names (any failure stops
//     the GC before it deletes anything), and deletes what is neither reached nor young.
//
// Run it from one process at a time: a second one while a live one runs returns ErrGCRunning.
func (s *Store) GC(ctx context.Context, grace time.Duration) (GCStats, error) {
	start := time.Now()
	if grace == 0 {
		grace = time.Hour
	} else if grace < 0 {
		grace = 0
	}
	prev, err := s.readGCState(ctx)
	if err != nil {
		return GCStats{}, err
	}
	if s.busy(prev) {
		return GCStats{}, fmt.Errorf("%w (%s)", ErrGCRunning, prev.Owner)
	}
	me := gcState{Gen: prev.Gen + 1, Running: true, Heartbeat: time.Now().UTC(), Owner: randomID()}
	if err := s.writeJSON(ctx, gcStateKey, me); err != nil {
		return GCStats{}, fmt.Errorf("artifacts: GC: %w", err)
	}
	s.log.Info("artifacts: GC started", "store", s.b.String(), "gen", me.Gen, "grace", grace)

	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var lastBeat atomic.Int64
	lastBeat.Store(time.Now().UnixNano())
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		s.heartbeat(gctx, me, &lastBeat, cancel)
	}()
	defer func() {
		cancel(nil)
		<-beatDone
		// Hand the store back even if the caller's context is gone: pushes wait for this.
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer fcancel()
		if cur, err := s.readGCState(fctx); err == nil && cur.Owner == me.Owner {
			done := me
			done.Running, done.Heartbeat = false, time.Now().UTC()
			if err := s.writeJSON(fctx, gcStateKey, done); err != nil {
				s.log.Warn("artifacts: GC could not mark itself finished; pushes wait until its state goes stale", "err", err)
			}
		}
	}()

	var st GCStats
	if st.StaleIntents, err = s.waitCommits(gctx); err != nil {
		return st, gcErr(gctx, err)
	}

	type obj struct {
		key  string
		size int64
		old  bool
	}
	stored := map[string]obj{} // digest -> object
	cutoff := time.Now().Add(-grace)
	for _, prefix := range []string{chunkPrefix, manifestPrefix} {
		err := s.b.List(gctx, prefix, func(o ObjectInfo) error {
			d := path.Base(o.Key)
			if !validDigest(d) || o.Key != prefix+d[:2]+"/"+d {
				return nil
			}
			stored[d] = obj{o.Key, o.Size, o.ModTime.Before(cutoff)}
			if prefix == chunkPrefix {
				st.Chunks++
			} else {
				st.Manifests++
			}
			return nil
		})
		if err != nil {
			return st, gcErr(gctx, err)
		}
	}

	reached := map[string]bool{}
	refs, err := s.Refs(gctx, "")
	if err != nil {
		return st, gcErr(gctx, err)
	}
	st.Refs = len(refs)
	for _, r := range refs {
		m, err := s.loadManifest(gctx, r.Manifest)
		if err != nil {
			return st, gcErr(gctx, fmt.Errorf("ref %s: %w (nothing deleted)", r.Name, err))
		}
		reached[r.Manifest] = true
		for _, e := range m.Entries {
			if e.Pack != "" {
				reached[e.Pack] = true
			}
			for _, d := range e.Chunks {
				if d != "" {
					reached[d] = true
				}
			}
		}
	}

	var mu sync.Mutex
	g, dctx := errgroup.WithContext(gctx)
	g.SetLimit(s.concurrency)
	for d, o := range stored {
		if reached[d] {
			continue
		}
		if !o.old {
			st.KeptYoung++
			continue
		}
		g.Go(func() error {
			// A GC stalled past its own staleness (a paused process) must not go on deleting:
			// pushes already treat it as dead.
			if time.Since(time.Unix(0, lastBeat.Load())) > s.gcStaleAfter/2 {
				return errors.New("GC heartbeat fell behind; stopping before deleting more")
			}
			if err := s.b.Delete(dctx, o.key); err != nil {
				return err
			}
			mu.Lock()
			if o.key[:len(chunkPrefix)] == chunkPrefix {
				st.DeletedChunks++
			} else {
				st.DeletedManifests++
			}
			st.FreedBytes += o.size
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return st, gcErr(gctx, err)
	}
	if sw, ok := s.b.(staleSweeper); ok {
		if st.StaleTemps, err = sw.sweepStale(gctx, max(grace, time.Hour)); err != nil {
			return st, gcErr(gctx, err)
		}
	}
	st.Duration = time.Since(start)
	s.log.Info("artifacts: GC finished", "store", s.b.String(), "gen", me.Gen, "refs", st.Refs,
		"chunks", st.Chunks, "deletedChunks", st.DeletedChunks, "deletedManifests", st.DeletedManifests,
		"freedBytes", st.FreedBytes, "keptYoung", st.KeptYoung, "took", st.Duration.Round(time.Millisecond))
	return st, nil
}

func gcErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	return fmt.Errorf("artifacts: GC: %w", err)
}

// heartbeat refreshes the running GC's state until ctx ends, and cancels the GC if another GC
// took the state over (this one was presumed dead).
func (s *Store) heartbeat(ctx context.Context, me gcState, lastBeat *atomic.Int64, cancel context.CancelCauseFunc) {
	t := time.NewTicker(s.gcHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := s.readGCState(ctx)
		if err != nil {
			s.log.Warn("artifacts: GC heartbeat", "err", err)
			continue
		}
		if cur.Owner != me.Owner || cur.Gen != me.Gen {
			cancel(fmt.Errorf("%w: the GC state was taken over by %s", ErrGCRunning, cur.Owner))
			return
		}
		me.Heartbeat = time.Now().UTC()
		if err := s.writeJSON(ctx, gcStateKey, me); err != nil {
			s.log.Warn("artifacts: GC heartbeat", "err", err)
			continue
		}
		lastBeat.Store(time.Now().UnixNano())
	}
}

// waitCommits waits until no live commit intent is left, removing those of dead pushes.
func (s *Store) waitCommits(ctx context.Context) (stale int, err error) {
	for {
		live := 0
		var dead []string
		err := s.b.List(ctx, intentPrefix, func(o ObjectInfo) error {
			if time.Since(o.ModTime) > s.intentTTL {
				dead = append(dead, o.Key)
			} else {
				live++
			}
			return nil
		})
		if err != nil {
			return stale, err
		}
		for _, k := range dead {
			if err := s.b.Delete(ctx, k); err != nil {
				return stale, err
			}
			stale++
		}
		if live == 0 {
			return stale, nil
		}
		if err := sleepCtx(ctx, s.pollInterval); err != nil {
			return stale, err
		}
	}
}
