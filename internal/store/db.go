package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// db is the database handle the store's queries go through. The queries are written once, in the
// SQL both engines share (`?` placeholders, integer booleans, ON CONFLICT … excluded); db adapts
// them to PostgreSQL where it is the engine: `$n` placeholders, booleans as integers (the columns
// are BIGINT there, as SQLite's INTEGER), and serializable transactions retried on a
// serialization failure, which is what SQLite's single writer gives for free.
type db struct {
	*sql.DB
	pg bool
	// queries and busy count what the store asked the database (the benchmark's "database share
	// of a create").
	queries atomic.Int64
	busy    atomic.Int64
}

func (d *db) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer d.count(time.Now())
	return d.DB.ExecContext(ctx, d.rebind(query), d.convert(args)...)
}

func (d *db) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	defer d.count(time.Now())
	return d.DB.QueryContext(ctx, d.rebind(query), d.convert(args)...)
}

func (d *db) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	defer d.count(time.Now())
	return d.DB.QueryRowContext(ctx, d.rebind(query), d.convert(args)...)
}

func (d *db) count(start time.Time) {
	d.queries.Add(1)
	d.busy.Add(int64(time.Since(start)))
}

// tx is a transaction with the same adaptations as db.
type tx struct {
	*sql.Tx
	d *db
}

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer t.d.count(time.Now())
	return t.Tx.ExecContext(ctx, t.d.rebind(query), t.d.convert(args)...)
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	defer t.d.count(time.Now())
	return t.Tx.QueryContext(ctx, t.d.rebind(query), t.d.convert(args)...)
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	defer t.d.count(time.Now())
	return t.Tx.QueryRowContext(ctx, t.d.rebind(query), t.d.convert(args)...)
}

// rebind turns `?` placeholders into PostgreSQL's `$1, $2, …`. Question marks inside quoted
// literals are left alone (no query here has one, but a literal must never shift the numbering).
func (d *db) rebind(query string) string {
	if !d.pg || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n, quote := 0, byte(0)
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// convert passes booleans as 0/1: the schema keeps them in integer columns on both engines, and
// pgx (rightly) refuses to encode a Go bool into a bigint.
func (d *db) convert(args []any) []any {
	if !d.pg {
		return args
	}
	for i, a := range args {
		switch v := a.(type) {
		case bool:
			args[i] = boolInt(v)
		case sql.NullBool:
			if v.Valid {
				args[i] = boolInt(v.Bool)
			} else {
				args[i] = nil
			}
		}
	}
	return args
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// pgTypes maps the schema's SQLite column types to PostgreSQL's: SQLite's INTEGER is 64-bit (the
// times are unix milliseconds), REAL is a double, BLOB is bytes.
var pgTypes = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\bINTEGER\b`), "BIGINT"},
	{regexp.MustCompile(`\bREAL\b`), "DOUBLE PRECISION"},
	{regexp.MustCompile(`\bBLOB\b`), "BYTEA"},
}

// migration returns migration text for this engine.
func (d *db) migration(m string) string {
	if !d.pg {
		return m
	}
	for _, t := range pgTypes {
		m = t.re.ReplaceAllString(m, t.with)
	}
	return m
}

// jsonMetadataMatch is the condition "the JSON object column col has key ? with string value ?".
func (d *db) jsonMetadataMatch(col string) string {
	if d.pg {
		return "(" + col + "::jsonb ->> ?) = ?"
	}
	// json_each yields keys and string values as plain text, so arbitrary keys need no JSON-path
	// quoting.
	return "EXISTS (SELECT 1 FROM json_each(" + col + ") WHERE key = ? AND value = ?)"
}

// contains is the condition "column col contains the string ?" (case-sensitive on both).
func (d *db) contains(col string) string {
	if d.pg {
		return "strpos(" + col + ", ?) > 0"
	}
	return "instr(" + col + ", ?) > 0"
}

// jsonArrayIDCount counts rows of table whose JSON array column col holds an object with "id" ?,
// among those matching where (which may be empty).
func (d *db) jsonArrayIDCount(table, col, where string) string {
	if where != "" {
		where = " AND " + where
	}
	if d.pg {
		return "(SELECT count(*) FROM " + table + ", jsonb_array_elements(" + table + "." + col + "::jsonb) m WHERE m ->> 'id' = ?" + where + ")"
	}
	return "(SELECT count(*) FROM " + table + ", json_each(" + table + "." + col + ") m WHERE json_extract(m.value, '$.id') = ?" + where + ")"
}

// isUnique reports whether err is a unique-constraint violation, on either engine.
func isUnique(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// retryable reports whether a PostgreSQL transaction failed only because it raced another one
// (serialization failure or deadlock) and may simply run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// Stats is what the store asked its database so far: statements run and the time they took.
type Stats struct {
	Queries int64
	Busy    time.Duration
}

// Stats returns the store's query count and time so far.
func (s *Store) Stats() Stats {
	return Stats{Queries: s.db.queries.Load(), Busy: time.Duration(s.db.busy.Load())}
}

// Engine names the database engine: "sqlite" or "postgres".
func (s *Store) Engine() string {
	if s.db.pg {
		return "postgres"
	}
	return "sqlite"
}

var errTxRetries = fmt.Errorf("transaction kept conflicting with concurrent ones")
