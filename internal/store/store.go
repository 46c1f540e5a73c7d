// Package store owns vmon's persistent state: API keys, templates, sandbox and snapshot records,
// volumes, secrets, join tokens, nodes, and the schema migrations. By default it is one embedded
// SQLite database (modernc.org/sqlite, no cgo) under the data dir; with --database it is a
// PostgreSQL database (pgx) that several drivers share. Both run the same queries and the same
// migrations (db.go adapts the few places the engines differ), and the same test suite.
//
// On PostgreSQL it also carries what drivers sharing it need from each other: a notification per
// changed sandbox record (Listen), leadership for the work one driver must do alone (Leader), and
// the cluster's shared keys (SharedKey).
//
// It only stores and loads typed records; it never decides lifecycle (that is the driver's job),
// never touches runtimes, files other than its own database, or the network beyond its database.
// Errors carry errdefs kinds (NotFound, Conflict, ...) so the edges can map them without knowing
// SQL.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// FileName is the database file inside the data dir.
const FileName = "vmon.db"

// Store is the database handle. It is safe for concurrent use.
type Store struct {
	db *db
	// cfg is the PostgreSQL connection's configuration (nil on SQLite): Listen and Leader hold
	// connections of their own.
	cfg *pgx.ConnConfig
	// locks is the PostgreSQL pool LockSandbox holds its connections in.
	locks *sql.DB
}

// Open opens (creating if needed) the database under dataDir and applies pending migrations.
func Open(ctx context.Context, dataDir string) (*Store, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	path := filepath.Join(dataDir, FileName)
	// Create the file ourselves so it is 0600 from the start: it holds env vars and access tokens.
	// SQLite gives the -wal and -shm files the same mode as the database.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create database file: %w", err)
	}
	f.Close()

	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	sqldb, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	// One connection: SQLite serialises writers anyway, and a single connection rules out
	// SQLITE_BUSY between our own goroutines. Every query here is short; the hot read path
	// (ingress lookups) is served from the driver's memory, not from here.
	sqldb.SetMaxOpenConns(1)
	sqldb.SetConnMaxIdleTime(0)
	s := &Store{db: &db{DB: sqldb}}
	if err := s.migrate(ctx); err != nil {
		sqldb.Close()
		return nil, err
	}
	return s, nil
}

// OpenPostgres connects to the PostgreSQL database dsn names (a postgres:// URL or key=value
// string, as libpq takes) and applies pending migrations; drivers starting together take turns.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--database: %w", err)
	}
	// The server drops a driver's session (and so frees its leadership and sandbox locks) within
	// a minute of the driver's host going silent, instead of after the kernel's two-hour
	// keepalive; the operator's own settings in the DSN win.
	for k, v := range map[string]string{"tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5",
		"tcp_keepalives_count": "3", "tcp_user_timeout": "60000"} {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	sqldb := stdlib.OpenDB(*cfg)
	sqldb.SetMaxOpenConns(maxPostgresConns)
	sqldb.SetMaxIdleConns(maxPostgresConns)
	sqldb.SetConnMaxIdleTime(5 * time.Minute)
	locks := stdlib.OpenDB(*cfg)
	locks.SetMaxOpenConns(maxPostgresLocks)
	// As many idle as open: a lock must not wait for a new connection whenever several steps run.
	locks.SetMaxIdleConns(maxPostgresLocks)
	s := &Store{db: &db{DB: sqldb, pg: true}, cfg: cfg, locks: locks}
	if err := s.Ping(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// maxPostgresConns bounds one driver's connections: creates, the API and expiry share them;
// operators size max_connections for their drivers times this.
const maxPostgresConns = 16

// maxPostgresLocks bounds the connections holding sandbox locks (one per sandbox being paused,
// resumed, killed or expired at that moment through this driver).
const maxPostgresLocks = 64

// Close closes the database.
func (s *Store) Close() error {
	if s.locks != nil {
		s.locks.Close()
	}
	return s.db.Close()
}

// Ping checks that the database answers (used by the health endpoint).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}

// SchemaVersion returns the applied schema version (SQLite's user_version; a one-row table on
// PostgreSQL).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	return s.schemaVersion(ctx, s.db.DB)
}

type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) schemaVersion(ctx context.Context, q rowQuerier) (int, error) {
	var v int
	query := "PRAGMA user_version"
	if s.db.pg {
		query = "SELECT version FROM vmon_schema"
	}
	if err := q.QueryRowContext(ctx, query).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// pgMigrationLock is the advisory lock drivers starting together take while they migrate.
const pgMigrationLock = 0x766d6f6e // "vmon"

func (s *Store) migrate(ctx context.Context) error {
	// Read committed, not serializable: a driver that waited for the lock below must read the
	// version the one before it wrote, not the one of its transaction's start.
	return s.tryTx(ctx, nil, func(tx *tx) error {
		if s.db.pg {
			// Migrations run inside one transaction under a lock, so a second driver starting now
			// waits and then finds them applied.
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, pgMigrationLock); err != nil {
				return fmt.Errorf("lock for migrations: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS vmon_schema (version INTEGER NOT NULL);
INSERT INTO vmon_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM vmon_schema)`); err != nil {
				return fmt.Errorf("create schema version table: %w", err)
			}
		}
		cur, err := s.schemaVersion(ctx, tx.Tx)
		if err != nil {
			return err
		}
		if cur > len(migrations) {
			return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", cur, len(migrations))
		}
		for v := cur; v < len(migrations); v++ {
			if _, err := tx.ExecContext(ctx, s.db.migration(migrations[v])); err != nil {
				return fmt.Errorf("apply migration %d: %w", v+1, err)
			}
			// The version is written inside the transaction (SQLite keeps user_version in the
			// database header), so a crash never leaves a half-applied migration marked as done.
			set := fmt.Sprintf("PRAGMA user_version = %d", v+1)
			if s.db.pg {
				set = fmt.Sprintf("UPDATE vmon_schema SET version = %d", v+1)
			}
			if _, err := tx.ExecContext(ctx, set); err != nil {
				return fmt.Errorf("apply migration %d: %w", v+1, err)
			}
		}
		if s.db.pg {
			return pgSetup(ctx, tx)
		}
		return nil
	})
}

// txRetries bounds how often a PostgreSQL transaction is run again after losing a race.
const txRetries = 10

// tx runs fn in a transaction and commits it if fn returns nil. On PostgreSQL the transaction is
// serializable, so the store's read-then-write steps (a volume's users, a template's aliases)
// stay as atomic across drivers as SQLite's single writer keeps them in one; one that loses a race
// runs again.
func (s *Store) tx(ctx context.Context, fn func(*tx) error) error {
	var opts *sql.TxOptions
	if s.db.pg {
		opts = &sql.TxOptions{Isolation: sql.LevelSerializable}
	}
	for attempt := 0; ; attempt++ {
		err := s.tryTx(ctx, opts, fn)
		if err == nil || !retryable(err) {
			return err
		}
		if attempt == txRetries {
			return fmt.Errorf("%w: %w", errTxRetries, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 5 * time.Millisecond):
		}
	}
}

func (s *Store) tryTx(ctx context.Context, opts *sql.TxOptions, fn func(*tx) error) error {
	t, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(&tx{Tx: t, d: s.db}); err != nil {
		t.Rollback()
		return err
	}
	if err := t.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Times are stored as unix milliseconds: enough for the API's RFC 3339 output, sortable, and
// readable with the sqlite3 shell.
func toMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func nullMillis(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromNullMillis(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromMillis(n.Int64)
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
