package jupyter

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// InterruptGrace bounds the wait for a kernel to come back after an interrupt.
const InterruptGrace = 10 * time.Second

// Process is a kernel's process (a Jupyter kernel, or another runner of cells), in a process
// group of its own so an interrupt or a shutdown reaches what a cell started too.
type Process struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error // set before exited closes
}

// Start starts cmd; wait, when set, runs before the process is reaped (readers of its output
// pipes, which must see EOF first).
func (p *Process) Start(cmd *exec.Cmd, wait func()) error {
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

// Exited is closed once the process is gone (nil before Start).
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr says how the process ended (valid once Exited is closed).
func (p *Process) ExitErr() error { return p.exitErr }

// Interrupt interrupts what the process runs, as Jupyter's signal interrupt mode does: SIGINT to
// its process group.
func (p *Process) Interrupt() error {
	if p.cmd == nil || p.cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
}

// Kill ends the process group and waits (briefly) for the process.
func (p *Process) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
}
