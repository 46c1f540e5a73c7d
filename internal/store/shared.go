package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// SandboxChannel is the PostgreSQL notification channel a trigger sends every changed sandbox
// record's id on, after its transaction commits.
const SandboxChannel = "vmon_sandboxes"

// pgSetup installs what only PostgreSQL has: the trigger behind SandboxChannel. It runs after
// every migration pass (it is idempotent), so a database made by an older binary gets it too.
func pgSetup(ctx context.Context, t *tx) error {
	_, err := t.ExecContext(ctx, `
CREATE OR REPLACE FUNCTION vmon_sandbox_changed() RETURNS trigger AS $$
BEGIN
	PERFORM pg_notify('`+SandboxChannel+`', COALESCE(NEW.id, OLD.id));
	RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER vmon_sandbox_changed AFTER INSERT OR UPDATE OR DELETE ON sandboxes
	FOR EACH ROW EXECUTE FUNCTION vmon_sandbox_changed();`)
	if err != nil {
		return fmt.Errorf("install the sandbox notification trigger: %w", err)
	}
	return nil
}

// Shared reports whether other drivers may share this database (PostgreSQL).
func (s *Store) Shared() bool { return s.db.pg }

// sandboxLockClass is the first key of the advisory locks LockSandbox takes (the second is a hash
// of the id), so they never meet the leadership locks, which use one bigint key.
const sandboxLockClass = 0x766d

// LockSandbox serialises one sandbox's lifecycle steps (kill, pause, resume, expiry, a node's
// reconciliation) across the drivers sharing the database: a session advisory lock, held on a
// connection of the lock pool until unlock. The lock pool is apart from the query pool, so that
// steps holding locks can always still query. On SQLite there is one driver, whose own locks
// suffice: it returns at once.
func (s *Store) LockSandbox(ctx context.Context, id string) (unlock func(), err error) {
	if !s.db.pg {
		return func() {}, nil
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	key := int32(h.Sum32())
	conn, err := s.locks.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1, $2)", sandboxLockClass, key); err != nil {
		conn.Close()
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), leaderPingTimeout)
		defer cancel()
		if _, err := conn.ExecContext(uctx, "SELECT pg_advisory_unlock($1, $2)", sandboxLockClass, key); err != nil {
			// The session is in doubt: end it, which releases every lock it holds.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		conn.Close()
	}, nil
}

// SharedKey returns the cluster-wide secret called name, making it with create if no driver has
// yet. Two drivers starting together both call create, and both end up with the one that was
// stored first.
func (s *Store) SharedKey(ctx context.Context, name string, create func() ([]byte, error)) ([]byte, error) {
	var v []byte
	err := s.db.QueryRowContext(ctx, `SELECT value FROM cluster_keys WHERE name = ?`, name).Scan(&v)
	if err == nil {
		return v, nil
	}
	if !isNoRows(err) {
		return nil, fmt.Errorf("read cluster key %s: %w", name, err)
	}
	made, err := create()
	if err != nil {
		return nil, err
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO cluster_keys (name, value, created_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO NOTHING`, name, made, toMillis(time.Now())); err != nil {
		return nil, fmt.Errorf("store cluster key %s: %w", name, err)
	}
	if err := s.db.QueryRowContext(ctx, `SELECT value FROM cluster_keys WHERE name = ?`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("read cluster key %s: %w", name, err)
	}
	return v, nil
}

// listenRetry is how long Listen and Leader wait before connecting again after losing the
// database.
const listenRetry = time.Second

// Listen calls changed with the id of every sandbox record any driver changes, until ctx ends.
// Whenever it (re)connects, before the first notification, it calls resync: notifications sent
// while it was away are lost, so the caller reloads what it keeps. On SQLite there is no other
// writer and it returns at once.
func (s *Store) Listen(ctx context.Context, log *slog.Logger, resync func(context.Context) error, changed func(ctx context.Context, id string)) {
	if !s.db.pg {
		return
	}
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, resync, changed)
		if ctx.Err() != nil {
			return
		}
		log.Warn("lost the database's sandbox notifications; connecting again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(listenRetry):
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, resync func(context.Context) error, changed func(ctx context.Context, id string)) error {
	conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+SandboxChannel); err != nil {
		return err
	}
	// A failed resync is a reason to start over: what was missed must not stay missed.
	if err := resync(ctx); err != nil {
		return fmt.Errorf("resync: %w", err)
	}
	for {
		// Waits are bounded so a connection that died without a word (a half-open TCP
		// connection) is found by a ping within a listenIdle, not after the kernel's keepalive.
		wctx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			changed(ctx, n.Payload)
			continue
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, leaderPingTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// listenIdle is how long the listener waits for a notification before it checks its connection.
const listenIdle = 15 * time.Second

// Leadership is whether this process is the one, among those sharing the database, that does the
// work exactly one must do (expiring sandboxes, fencing lost nodes). On PostgreSQL it is a
// session advisory lock held on a connection of its own: the database lets it go the moment that
// connection ends, so a driver that dies hands leadership over at once.
type Leadership struct {
	mu      sync.Mutex
	leading bool
	changed chan struct{}
}

// Leading reports whether this process leads now.
func (l *Leadership) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Changed returns a channel closed at the next change of Leading.
func (l *Leadership) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *Leadership) set(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading == v {
		return
	}
	l.leading = v
	close(l.changed)
	l.changed = make(chan struct{})
}

// leaderCheck is how often a follower tries for leadership, and a leader checks that its
// connection (and so its lock) still holds.
const leaderCheck = time.Second

// leaderPingTimeout is how long a leader waits for its connection to answer before stepping down.
const leaderPingTimeout = 5 * time.Second

// Leader returns this process's leadership of name among the processes sharing the database and
// keeps contending for it until ctx ends. On SQLite the process is alone and always leads.
func (s *Store) Leader(ctx context.Context, name string, log *slog.Logger) *Leadership {
	l := &Leadership{changed: make(chan struct{})}
	if !s.db.pg {
		l.set(true)
		return l
	}
	h := fnv.New64a()
	h.Write([]byte("vmon leader " + name))
	key := int64(h.Sum64())
	go func() {
		defer l.set(false)
		for ctx.Err() == nil {
			err := s.lead(ctx, key, l)
			l.set(false)
			if ctx.Err() != nil {
				return
			}
			log.Warn("lost the database connection that holds leadership; connecting again", "role", name, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(listenRetry):
			}
		}
	}()
	return l
}

func (s *Store) lead(ctx context.Context, key int64, l *Leadership) error {
	conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(leaderCheck)
	defer t.Stop()
	for {
		if l.Leading() {
			// Holding: the lock lasts as long as the connection, so check the connection. One that
			// does not answer in time is given up: whatever this process would lead, it could not
			// record without the database anyway.
			pctx, cancel := context.WithTimeout(ctx, leaderPingTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
		} else {
			var got bool
			if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
				return err
			}
			l.set(got)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
