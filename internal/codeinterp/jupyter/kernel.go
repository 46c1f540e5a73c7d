package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Spec says how to start a kernel.
type Spec struct {
	// Argv starts the kernel; "{connection_file}" is replaced by the connection file's path
	// (as in a kernelspec's kernel.json).
	Argv []string
	// Env is the kernel's environment (nil: this process's).
	Env []string
	// Dir is the kernel's working directory.
	Dir string
	// RuntimeDir holds the connection file (it carries the session key: 0700).
	RuntimeDir string
	// StartTimeout bounds the wait for the kernel's first answer (StartWithin when unset).
	StartTimeout time.Duration
	Log          *slog.Logger
}

// ErrDied is returned (wrapped) by calls on a kernel whose process exited.
var ErrDied = errors.New("the kernel exited")

// Kernel is one running kernel process and the client's sockets to it.
type Kernel struct {
	proc    Process
	spec    Spec
	connFn  string
	signer  signer
	session string
	log     *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	shell  zmq4.Socket
	iopub  zmq4.Socket
	sendMu sync.Mutex // zmq4 sockets are not safe for concurrent sends

	mu sync.Mutex
	// +checklocks:mu
	waiters map[string]*waiter
}

// waiter collects what the kernel sends about one request.
type waiter struct {
	iopub chan Message
	reply chan Message
}

type connectionInfo struct {
	IP              string `json:"ip"`
	Transport       string `json:"transport"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// StartWithin is how long a kernel of spec may take to start: StartTimeout, or a minute.
func (s Spec) StartWithin() time.Duration {
	if s.StartTimeout > 0 {
		return s.StartTimeout
	}
	return time.Minute
}

// Start starts a kernel and waits until it answers kernel_info and its iopub channel delivers.
func Start(ctx context.Context, spec Spec) (_ *Kernel, err error) {
	if spec.Log == nil {
		spec.Log = slog.New(slog.DiscardHandler)
	}
	ports, release, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	defer release() // by then the kernel listens on them, or is gone
	key := newID() + newID()
	info := connectionInfo{IP: "127.0.0.1", Transport: "tcp", ShellPort: ports[0], IOPubPort: ports[1],
		StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4], Key: key, SignatureScheme: "hmac-sha256"}
	if err := os.MkdirAll(spec.RuntimeDir, 0o700); err != nil {
		return nil, fmt.Errorf("kernel runtime dir: %w", err)
	}
	connFn := filepath.Join(spec.RuntimeDir, "kernel-"+newID()[:12]+".json")
	b, _ := json.Marshal(info)
	if err := os.WriteFile(connFn, b, 0o600); err != nil {
		return nil, fmt.Errorf("write kernel connection file: %w", err)
	}
	argv := make([]string, len(spec.Argv))
	for i, a := range spec.Argv {
		argv[i] = strings.ReplaceAll(a, "{connection_file}", connFn)
	}
	kctx, cancel := context.WithCancel(context.Background())
	k := &Kernel{spec: spec, connFn: connFn, signer: signer{key: []byte(key)}, session: newID(),
		log: spec.Log, ctx: kctx, cancel: cancel, waiters: map[string]*waiter{}}
	defer func() {
		if err != nil {
			k.Shutdown()
		}
	}()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = spec.Env, spec.Dir
	cmd.Stdout, cmd.Stderr = logWriter{k.log, "kernel stdout"}, logWriter{k.log, "kernel stderr"}
	if err := k.proc.Start(cmd); err != nil {
		return nil, fmt.Errorf("start kernel %s: %w", argv[0], err)
	}

	addr := func(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }
	k.shell = zmq4.NewDealer(kctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	k.iopub = zmq4.NewSub(kctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	sctx, scancel := context.WithTimeout(ctx, spec.StartWithin())
	defer scancel()
	if err := k.dial(sctx, k.shell, addr(info.ShellPort)); err != nil {
		return nil, err
	}
	if err := k.dial(sctx, k.iopub, addr(info.IOPubPort)); err != nil {
		return nil, err
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return nil, fmt.Errorf("subscribe to kernel iopub: %w", err)
	}
	go k.readLoop(k.shell, true)
	go k.readLoop(k.iopub, false)
	if err := k.waitReady(sctx); err != nil {
		return nil, err
	}
	return k, nil
}

// dial connects s, giving up when the kernel exits or ctx ends.
func (k *Kernel) dial(ctx context.Context, s zmq4.Socket, addr string) error {
	done := make(chan error, 1)
	go func() { done <- s.Dial(addr) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("connect to kernel at %s: %w", addr, err)
		}
		return nil
	case <-k.proc.Exited():
		return fmt.Errorf("%w while starting: %v", ErrDied, k.proc.ExitErr())
	case <-ctx.Done():
		return fmt.Errorf("kernel did not listen at %s: %w", addr, ctx.Err())
	}
}

// waitReady asks kernel_info until the kernel answers on shell and an iopub message about one of
// the requests arrives: a subscription only receives what is published after it took effect.
func (k *Kernel) waitReady(ctx context.Context) error {
	replied := false
	for {
		msg, err := k.newMessage("kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		w := k.register(msg.Header.MsgID)
		if err := k.send(msg); err != nil {
			k.unregister(msg.Header.MsgID)
			return err
		}
		tick := time.NewTimer(200 * time.Millisecond)
		iopubSeen := false
	wait:
		for {
			select {
			case <-w.reply:
				replied = true
			case <-w.iopub:
				iopubSeen = true
			case <-tick.C:
				break wait
			case <-k.proc.Exited():
				k.unregister(msg.Header.MsgID)
				return fmt.Errorf("%w while starting: %v", ErrDied, k.proc.ExitErr())
			case <-ctx.Done():
				k.unregister(msg.Header.MsgID)
				return fmt.Errorf("kernel did not answer: %w", ctx.Err())
			}
			if replied && iopubSeen {
				tick.Stop()
				k.unregister(msg.Header.MsgID)
				return nil
			}
		}
		k.unregister(msg.Header.MsgID)
	}
}

func (k *Kernel) register(id string) *waiter {
	w := &waiter{iopub: make(chan Message, 256), reply: make(chan Message, 1)}
	k.mu.Lock()
	k.waiters[id] = w
	k.mu.Unlock()
	return w
}

func (k *Kernel) unregister(id string) {
	k.mu.Lock()
	delete(k.waiters, id)
	k.mu.Unlock()
}

func (k *Kernel) send(msg Message) error {
	frames, err := k.signer.encode(msg)
	if err != nil {
		return err
	}
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	if err := k.shell.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		return fmt.Errorf("send %s to kernel: %w", msg.Header.MsgType, err)
	}
	return nil
}

// readLoop routes what arrives on s to the request it answers. A waiter whose buffer is full
// blocks the loop: the executor reads without pause, and the kernel's own queue holds the rest.
func (k *Kernel) readLoop(s zmq4.Socket, shell bool) {
	for {
		raw, err := s.Recv()
		if err != nil {
			if k.ctx.Err() == nil {
				k.log.Debug("kernel socket closed", "shell", shell, "err", err)
			}
			return
		}
		msg, err := k.signer.decode(raw.Frames)
		if err != nil {
			k.log.Warn("dropped a kernel message", "err", err)
			continue
		}
		// Routed by parent header only: output under a parent no request has (a cell that ended,
		// a kernel_info of the start) belongs to nobody waiting now.
		k.mu.Lock()
		w := k.waiters[msg.Parent.MsgID]
		k.mu.Unlock()
		if w == nil {
			if !shell && msg.Header.MsgType != "status" {
				// Output nobody receives: a lost cell value would show here (issue 22 item 7).
				k.log.Info("kernel output for no waiting request", "type", msg.Header.MsgType,
					"parent", msg.Parent.MsgID, "parent_type", msg.Parent.MsgType)
			}
			continue
		}
		ch := w.iopub
		if shell {
			ch = w.reply
		}
		select {
		case ch <- msg:
		case <-k.ctx.Done():
			return
		}
	}
}

// Exited is closed once the kernel process is gone.
func (k *Kernel) Exited() <-chan struct{} { return k.proc.Exited() }

// ExitErr says how the kernel process ended (valid once Exited is closed).
func (k *Kernel) ExitErr() error { return k.proc.ExitErr() }

// Interrupt interrupts what the kernel runs: SIGINT to its process group.
func (k *Kernel) Interrupt() error { return k.proc.Interrupt() }

// Shutdown kills the kernel and everything in its process group and closes the sockets.
func (k *Kernel) Shutdown() {
	k.proc.Kill()
	k.cancel()
	if k.shell != nil {
		_ = k.shell.Close()
	}
	if k.iopub != nil {
		_ = k.iopub.Close()
	}
	_ = os.Remove(k.connFn)
}

// handedOut holds the ports given to kernels that may not have bound them yet. The OS can give a
// port freePorts closed to the next caller, and two contexts started at once must not share one.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePorts reserves n distinct loopback ports (released just before the kernel binds them, as
// jupyter_client does), none handed to another kernel start still in progress. release ends the
// reservation once the kernel has bound them or given up.
func freePorts(n int) (ports []int, release func(), err error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	handedOut.Lock()
	defer handedOut.Unlock()
	for len(ports) < n {
		// A port that is handed out stays open here meanwhile, so the next bind gets another.
		if len(ls) > n+64 {
			return nil, nil, errors.New("reserve kernel ports: the OS keeps offering ports other kernel starts hold")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, fmt.Errorf("reserve a kernel port: %w", err)
		}
		ls = append(ls, l)
		if p := l.Addr().(*net.TCPAddr).Port; !handedOut.ports[p] {
			ports = append(ports, p)
		}
	}
	for _, p := range ports {
		handedOut.ports[p] = true
	}
	return ports, func() {
		handedOut.Lock()
		defer handedOut.Unlock()
		for _, p := range ports {
			delete(handedOut.ports, p)
		}
	}, nil
}

// logWriter sends a kernel's own output to the service log.
type logWriter struct {
	log *slog.Logger
	msg string
}

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug(w.msg, "text", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
