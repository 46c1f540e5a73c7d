package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	pb "github.com/vibemon/vmon/internal/envd/gen/process"
)

const (
	// Chunk sizes of data events (E2B: 32 KiB for pipes, 16 KiB for a PTY).
	pipeChunk = 32 << 10
	ptyChunk  = 16 << 10
	// subscriberBuffer bounds how far one stream may lag before the process's output blocks.
	subscriberBuffer = 64
	// drainGrace is how long output is still read after the process exited. A background child
	// that inherited stdout keeps the pipe open forever; without a bound the end event would never
	// come (a shell behaves the same way, but the SDK would just hang).
	drainGrace = 100 * time.Millisecond
)

// proc is one process started by Start, from launch until it is forgotten (retention after exit).
type proc struct {
	pid uint32
	tag *string
	// user is who the process runs as (for the journal).
	user string
	// outTap, when set, also takes the process's output line by line (the start command's).
	outTap *outputTap
	config *pb.ProcessConfig
	cmd    *exec.Cmd
	// starter started cmd and is told once cmd.Wait has collected it.
	starter Starter

	// ptmx is the PTY master of a PTY process (nil for pipe processes). It is non-blocking so
	// reads can be given a deadline.
	ptmx *os.File
	// outputs are the read ends the pumps read: stdout+stderr pipes, or the PTY master.
	outputs []output

	inMu sync.Mutex
	// stdin is the write end of the stdin pipe; nil when disabled or closed. +checklocks:inMu
	stdin io.WriteCloser

	mu sync.Mutex
	// +checklocks:mu
	subs map[*subscriber]struct{}
	// end is set once, after all output was delivered. +checklocks:mu
	end *pb.ProcessEvent_EndEvent

	// exited is closed right after end is set.
	exited chan struct{}
	// stopOut is closed by SIGKILL/SIGTERM: output is no longer forwarded (E2B semantics).
	stopOut  chan struct{}
	stopOnce sync.Once
	// timedOut is closed when the Connect-Timeout-Ms of the Start request killed the process.
	timedOut    chan struct{}
	timeoutOnce sync.Once
	timer       *time.Timer
}

type output struct {
	f    *os.File
	kind outputKind
}

type outputKind int

const (
	kindStdout outputKind = iota
	kindStderr
	kindPTY
)

// subscriber is one stream (Start or Connect) following a process.
type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
}

func newProc(cmd *exec.Cmd, config *pb.ProcessConfig, tag *string) *proc {
	return &proc{
		cmd:      cmd,
		config:   config,
		tag:      tag,
		subs:     map[*subscriber]struct{}{},
		exited:   make(chan struct{}),
		stopOut:  make(chan struct{}),
		timedOut: make(chan struct{}),
	}
}

// subscribe registers a stream. If the process already ended it returns the retained end event
// instead, so Connect can replay start + end.
func (p *proc) subscribe() (*subscriber, *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil, p.end
	}
	s := &subscriber{ch: make(chan *pb.ProcessEvent, subscriberBuffer), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[s]; ok {
		delete(p.subs, s)
		close(s.gone)
	}
}

// broadcast hands ev to every current subscriber. It blocks on a full subscriber (back-pressure on
// the process) until that stream takes it, goes away, or output forwarding is stopped.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		case <-p.stopOut:
			return
		}
	}
}

// run starts the output pumps and the waiter; onEnd runs when the process has ended.
func (p *proc) run(onEnd func()) {
	var pumps sync.WaitGroup
	for _, o := range p.outputs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			p.pump(o)
		}()
	}
	go func() {
		waitErr := p.cmd.Wait()
		p.starter.Forget(int(p.pid))
		if p.timer != nil {
			p.timer.Stop()
		}
		// Whatever is already buffered is read at once; a background holder of the pipe gets cut off.
		for _, o := range p.outputs {
			_ = o.f.SetReadDeadline(time.Now().Add(drainGrace))
		}
		pumps.Wait()
		for _, o := range p.outputs {
			_ = o.f.Close()
		}
		p.closeStdin()

		end := endEvent(p.cmd.ProcessState, waitErr)
		p.mu.Lock()
		p.end = end
		p.mu.Unlock()
		close(p.exited)
		onEnd()
	}()
}

func (p *proc) pump(o output) {
	size := pipeChunk
	if o.kind == kindPTY {
		size = ptyChunk
	}
	var lines lineSplitter
	for {
		buf := make([]byte, size)
		n, err := o.f.Read(buf)
		if n > 0 {
			if p.outTap != nil {
				lines.feed(buf[:n], func(l []byte) { p.outTap.line(o.kind, l) })
			}
			p.broadcast(dataEvent(o.kind, buf[:n]))
		}
		if err != nil {
			// EOF for pipes, EIO for a PTY whose slave side is closed, a deadline after exit.
			if p.outTap != nil {
				lines.flush(func(l []byte) { p.outTap.line(o.kind, l) })
			}
			return
		}
	}
}

func endEvent(st *os.ProcessState, waitErr error) *pb.ProcessEvent_EndEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: -1}
	if st != nil {
		end.ExitCode = int32(st.ExitCode())
		end.Exited = st.Exited()
		end.Status = st.String()
	}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
		if end.Status == "" {
			end.Status = msg
		}
	}
	return end
}

func dataEvent(kind outputKind, b []byte) *pb.ProcessEvent {
	d := &pb.ProcessEvent_DataEvent{}
	switch kind {
	case kindStdout:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case kindStderr:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}

// signal delivers sig to the process's whole process group (it leads its own session), so that
// children of the shell get it too.
func (p *proc) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.stopOnce.Do(func() { close(p.stopOut) })
	}
	pid := int(p.pid)
	if err := syscall.Kill(-pid, sig); err != nil {
		if err2 := syscall.Kill(pid, sig); err2 != nil && !errors.Is(err2, syscall.ESRCH) {
			return fmt.Errorf("signal process %d: %w", pid, err2)
		}
	}
	return nil
}

// timeout kills the process because its Start request's deadline passed.
func (p *proc) timeout() {
	p.timeoutOnce.Do(func() { close(p.timedOut) })
	_ = p.signal(syscall.SIGKILL)
}

func (p *proc) writeStdin(b []byte) error {
	if p.ptmx != nil {
		return fmt.Errorf("process %d has a PTY: send input as pty, not stdin", p.pid)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return fmt.Errorf("stdin of process %d is not enabled or already closed", p.pid)
	}
	if _, err := p.stdin.Write(b); err != nil {
		return fmt.Errorf("write stdin of process %d: %w", p.pid, err)
	}
	return nil
}

func (p *proc) writePTY(b []byte) error {
	if p.ptmx == nil {
		return fmt.Errorf("process %d has no PTY: send input as stdin, not pty", p.pid)
	}
	if _, err := p.ptmx.Write(b); err != nil {
		return fmt.Errorf("write pty of process %d: %w", p.pid, err)
	}
	return nil
}

func (p *proc) closeStdin() {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
}

func (p *proc) info() *pb.ProcessInfo {
	return &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag}
}

func (p *proc) ended() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}
