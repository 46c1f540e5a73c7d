package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

// spec is a fully resolved launch request.
type spec struct {
	user  *users.User
	path  string // executable, as requested (looked up in the env's PATH when it has no slash)
	args  []string
	env   []string
	dir   string
	pty   *pb.PTY // nil: pipes
	stdin bool
}

// spawn starts the process described by s, in a new session (so it leads its own process group
// and signals can reach its children) and with the user's credentials.
func spawn(s spec, config *pb.ProcessConfig, tag *string, st Starter) (*proc, error) {
	exe, err := lookPath(s.path, s.env, s.dir)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: exe, Args: append([]string{s.path}, s.args...), Env: s.env, Dir: s.dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: credential(s.user)}
	p := newProc(cmd, config, tag)
	p.starter = st
	if s.pty != nil {
		err = startPTY(p, s)
	} else {
		err = startPipes(p, s)
	}
	if err != nil {
		return nil, err
	}
	p.pid = uint32(cmd.Process.Pid)
	return p, nil
}

// credential returns nil when envd already runs as the target user (envd not root, as in some
// tests), because setgroups would fail without CAP_SETGID.
func credential(u *users.User) *syscall.Credential {
	if os.Geteuid() != 0 && uint32(os.Geteuid()) == u.UID {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

func startPipes(p *proc, s spec) (err error) {
	var closeOnErr, closeAfterStart []*os.File
	defer func() {
		for _, f := range closeAfterStart {
			_ = f.Close()
		}
		if err != nil {
			for _, f := range closeOnErr {
				_ = f.Close()
			}
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	closeOnErr, closeAfterStart = append(closeOnErr, outR), append(closeAfterStart, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stderr pipe: %w", err)
	}
	closeOnErr, closeAfterStart = append(closeOnErr, errR), append(closeAfterStart, errW)
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	if s.stdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("stdin pipe: %w", err)
		}
		closeOnErr, closeAfterStart = append(closeOnErr, inW), append(closeAfterStart, inR)
		p.cmd.Stdin = inR
		p.stdin = inW
	}
	// Stdin nil means /dev/null: the process sees EOF at once (stdin:false).
	if err := p.starter.Start(p.cmd); err != nil {
		return startError(p.cmd, err)
	}
	p.outputs = []output{{outR, kindStdout}, {errR, kindStderr}}
	return nil
}

func startPTY(p *proc, s spec) (err error) {
	master, slave, err := pty.Open()
	if err != nil {
		return fmt.Errorf("open pty: %w", err)
	}
	defer slave.Close()
	// pty.Open leaves the master in blocking mode (it calls Fd()). Re-wrap a non-blocking duplicate
	// so the runtime poller owns it and a read can be cut off by a deadline after the process exits.
	fd, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	_ = master.Close()
	if err != nil {
		return fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("pty master nonblock: %w", err)
	}
	ptmx := os.NewFile(uintptr(fd), "/dev/ptmx")
	defer func() {
		if err != nil {
			_ = ptmx.Close()
		}
	}()
	if size := s.pty.GetSize(); size != nil && size.GetCols() > 0 && size.GetRows() > 0 {
		ws := &unix.Winsize{Col: uint16(size.GetCols()), Row: uint16(size.GetRows())}
		if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, ws); err != nil {
			return fmt.Errorf("set pty size: %w", err)
		}
	}
	// Like login(1): the terminal belongs to the user, so tools that check it (sudo, mesg) work.
	_ = os.Chown(slave.Name(), int(s.user.UID), -1)
	_ = os.Chmod(slave.Name(), 0o620)

	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr.Setctty = true
	p.cmd.SysProcAttr.Ctty = 0 // the child's fd 0 is the slave
	if err := p.starter.Start(p.cmd); err != nil {
		return startError(p.cmd, err)
	}
	p.ptmx = ptmx
	p.outputs = []output{{ptmx, kindPTY}}
	return nil
}

// resize sets the window size of a PTY process.
func (p *proc) resize(size *pb.PTY_Size) error {
	if p.ptmx == nil {
		return fmt.Errorf("process %d has no PTY", p.pid)
	}
	ws := &unix.Winsize{Col: uint16(size.GetCols()), Row: uint16(size.GetRows())}
	rc, err := p.ptmx.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	var ioErr error
	// Control, not Fd(): Fd() would switch the master back to blocking mode.
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("resize pty: %w", ioErr)
	}
	return nil
}

// startError classifies a failed spawn as E2B's envd does: the sandbox's limits (tasks, open
// files, ptys, memory) are resource_exhausted, a failure the caller can retry once it freed some;
// anything else is a bad request (no such binary, not executable) and invalid_argument.
func startError(cmd *exec.Cmd, err error) error {
	kind := errdefs.KindInvalidArgument
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EMFILE) ||
		errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOSPC) {
		kind = errdefs.KindResourceExhausted
	}
	return errdefs.Wrap(kind, err, "start %q: %v", cmd.Path, err)
}

// lookPath finds name in the PATH the process will get (not envd's own), as a shell would.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v // later entries win, like exec's dedup
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		cand := filepath.Join(d, name)
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", errdefs.InvalidArgument("executable %q not found in PATH", name)
}
