// Package pgtest runs a real PostgreSQL server from Debian's packages for tests: initdb in a
// temporary directory, the server listening only on a Unix socket there, stopped and removed
// afterwards. Tests get a fresh database each (DSN).
//
// It never mocks the database, and it never touches a server it did not start. PostgreSQL refuses
// to run as root, so as root the server runs as the `postgres` user the Debian package creates.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL server owned by the test process.
type Server struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// binDir finds Debian's PostgreSQL binaries (the newest installed major version).
func binDir() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) == 0 {
		return "", errors.New("PostgreSQL is not installed (apt install postgresql; scripts/install-deps.sh does)")
	}
	sort.Slice(matches, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return a > b
	})
	return filepath.Dir(matches[0]), nil
}

// Start initialises a cluster in a new temporary directory and starts a server on a Unix socket
// there. Stop it with Stop.
func Start(ctx context.Context) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "vmon-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("PostgreSQL will not run as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		c.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8"}
		return c
	}
	data := filepath.Join(dir, "data")
	if out, err := run("initdb", "-D", data, "-U", "vmon", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		_ = log.Chown(int(cred.Uid), int(cred.Gid))
	}
	// Durability off: a test's database dies with the test.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-k", dir, "-c", "listen_addresses=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGTERM}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		log.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	go func() { _ = s.cmd.Wait(); log.Close(); close(s.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(ctx, s.dsn("postgres"))
		if err == nil {
			c.Close(ctx)
			return s, nil
		}
		select {
		case <-s.done:
			out, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("postgres exited: %s", out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("postgres did not accept connections within 30 s: %w", err)
		}
	}
}

func (s *Server) dsn(db string) string {
	return fmt.Sprintf("host=%s user=vmon dbname=%s sslmode=disable", s.dir, db)
}

// Dir is the directory holding the server's data and socket.
func (s *Server) Dir() string { return s.dir }

// CreateDB makes a new empty database and returns its DSN.
func (s *Server) CreateDB(ctx context.Context) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	c, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return s.dsn(name), nil
}

// Stop shuts the server down (fast mode) and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

var (
	shared    *Server
	sharedErr error
	once      sync.Once
)

// DSN returns a fresh database on the package's shared server, starting the server at the first
// call. A test binary that uses it must stop the server at exit: call Main from TestMain.
func DSN(t testing.TB) string {
	t.Helper()
	once.Do(func() { shared, sharedErr = Start(context.Background()) })
	if sharedErr != nil {
		t.Fatalf("PostgreSQL for tests: %v", sharedErr)
	}
	dsn, err := shared.CreateDB(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Main runs the tests and stops the shared server if one started.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}
