package codeinterp

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// proc is a kernel process that is not a Jupyter kernel (bash, the Node.js runner), in a process
// group of its own so an interrupt or a shutdown reaches what the cell started too.
type proc struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error // set before exited closes
}

// start starts cmd; wait, when set, runs before the process is reaped (its output readers, which
// must see EOF first).
func (p *proc) start(cmd *exec.Cmd, wait func()) error {
	p.cmd, p.exited = cmd, make(chan struct{})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		if wait != nil {
			wait()
		}
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exit status 0")
		}
		p.exitErr = err
		close(p.exited)
	}()
	return nil
}

// interrupt sends SIGINT to the group and returns the deadline for the cell to stop.
func (p *proc) interrupt() <-chan time.Time {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	return time.After(10 * time.Second)
}

func (p *proc) ExitErr() error { return p.exitErr }

// kill ends the group and waits (briefly) for the process.
func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
}
