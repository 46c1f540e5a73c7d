package jupyter

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// InterruptGrace bounds the wait for a kernel to come back after an interrupt (a variable so
// tests can shorten it).
var InterruptGrace = 10 * time.Second

// ReplyAfterIdle bounds the wait for an interrupted execution's reply once the kernel went idle
// for it (see Execute).
const ReplyAfterIdle = 2 * time.Second

// ErrStuck is returned (wrapped) by an execution whose kernel was interrupted and did not finish
// the cell within InterruptGrace: it may never answer again (a loop that ignores SIGINT).
var ErrStuck = errors.New("the kernel did not stop after an interrupt")

// Process is a kernel's process (a Jupyter kernel, or another runner of cells), in a process
// group of its own so an interrupt or a shutdown reaches what a cell started too.
type Process struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error // set before exited closes
}

// Start starts cmd in a process group of its own. Its output should go to writers, not pipes
// the caller reads: Wait (and so Exited) must not depend on a reader seeing EOF.
func (p *Process) Start(cmd *exec.Cmd) error {
	p.cmd, p.exited = cmd, make(chan struct{})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A cell's background job can hold the kernel's output after the kernel exits: its death
	// is reported this long after, not when the job ends.
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = outputGrace
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		err := cmd.Wait()
		if err == nil || errors.Is(err, exec.ErrWaitDelay) {
			err = errors.New("exit status 0")
		}
		p.exitErr = err
		close(p.exited)
	}()
	return nil
}

// outputGrace is how long a kernel's output may stay open after it exits.
const outputGrace = 2 * time.Second

// Exited is closed once the process is gone (nil before Start).
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr says how the process ended. Asked before that (a write to it failed as it went), it
// waits a moment for the exit.
func (p *Process) ExitErr() error {
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(time.Second):
		return errors.New("the process has not exited")
	}
}

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
