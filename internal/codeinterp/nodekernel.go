package codeinterp

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

//go:embed node-runner.js
var nodeRunner []byte

// Node runs JavaScript (and TypeScript, transpiled with Debian's node-typescript) in a Node.js
// process per context (node-runner.js), which speaks a small JSON-lines protocol instead of
// Jupyter's: Debian packages no Jupyter kernel for JavaScript.
func Node(node, lang string) Language {
	return Language{
		Start: func(ctx context.Context, spec jupyter.Spec) (kernel, error) { return startNode(ctx, node, lang, spec) },
		Chdir: nil, // the process starts in the context's directory
		SetEnv: func(env map[string]string) (string, string) {
			b, _ := json.Marshal(env)
			set := "globalThis.__vmonSaved = Object.fromEntries(Object.keys(" + string(b) + ").map((k) => [k, process.env[k]]));\n" +
				"Object.assign(process.env, " + string(b) + ");\nundefined"
			restore := "for (const [k, v] of Object.entries(globalThis.__vmonSaved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }\n" +
				"delete globalThis.__vmonSaved;\nundefined"
			return set, restore
		},
		ExportEnv: func(env map[string]string) string {
			b, _ := json.Marshal(env)
			return "Object.assign(process.env, " + string(b) + ");\nundefined"
		},
	}
}

// nodeKernel is one runner process speaking node-runner.js's protocol: node-runner.js, or
// JavaRunner.java.
type nodeKernel struct {
	jupyter.Process
	lang  string
	stdin io.WriteCloser
	log   *slog.Logger
	// name says which runner, in errors; encode frames one cell for its stdin.
	name   string
	encode func(id, code string) []byte
	// interrupt, when set, frames the in-band interrupt of a cell (see awaitCell's soft).
	interrupt func(id string) []byte
	// writeMu keeps a cell and an interrupt from interleaving on stdin.
	writeMu sync.Mutex

	mu sync.Mutex
	// +checklocks:mu
	waiters map[string]chan nodeEvent
	seq     int
}

type nodeEvent struct {
	ID    *string `json:"id"`
	Type  string  `json:"type"`
	Name  string  `json:"name"`
	Text  string  `json:"text"`
	Value string  `json:"value"`
	Stack string  `json:"stack"`
	Count int     `json:"count"`
}

func startNode(ctx context.Context, node, lang string, spec jupyter.Spec) (kernel, error) {
	encode := func(id, code string) []byte {
		b, _ := json.Marshal(map[string]string{"id": id, "code": code, "lang": lang})
		return b
	}
	// Node's breakOnSigint takes the runner's SIGINT listener away while a cell's synchronous
	// part starts and ends, and a SIGINT then kills the runner with the context's state: a cell
	// that waits (an await) is interrupted in band, and only one that holds the event loop
	// gets the signal.
	interrupt := func(id string) []byte {
		b, _ := json.Marshal(map[string]string{"interrupt": id})
		return b
	}
	return startRunner(ctx, spec, runnerSpec{name: "the node runner", file: "node-runner.js", body: nodeRunner,
		argv: []string{node}, lang: lang, encode: encode, interrupt: interrupt})
}

// runnerSpec is a kernel process speaking node-runner.js's protocol: argv plus the runner file,
// written to the runtime directory.
type runnerSpec struct {
	name, file, lang string
	body             []byte
	argv             []string
	encode           func(id, code string) []byte
	// interrupt frames an in-band interrupt; nil: interrupts are signals only.
	interrupt func(id string) []byte
}

func startRunner(ctx context.Context, spec jupyter.Spec, rs runnerSpec) (kernel, error) {
	if err := os.MkdirAll(spec.RuntimeDir, 0o700); err != nil {
		return nil, err
	}
	script, err := writeRunner(spec.RuntimeDir, rs.file, rs.body)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", rs.name, err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	k := &nodeKernel{lang: rs.lang, log: spec.Log, waiters: map[string]chan nodeEvent{}, name: rs.name, encode: rs.encode, interrupt: rs.interrupt}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	cmd := exec.Command(rs.argv[0], append(rs.argv[1:], script)...)
	cmd.Env, cmd.Dir = spec.Env, spec.Dir
	cmd.ExtraFiles = []*os.File{evW}                // fd 3: the runner's events
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard // the runner reports its own output on fd 3
	if k.stdin, err = cmd.StdinPipe(); err != nil {
		evR.Close()
		evW.Close()
		return nil, err
	}
	if err := k.Start(cmd); err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("start %s: %w", rs.argv[0], err)
	}
	evW.Close()
	ready := make(chan struct{})
	go k.readEvents(evR, ready)
	select {
	case <-ready:
		return k, nil
	case <-k.Exited():
		return nil, fmt.Errorf("%w while starting: %v", jupyter.ErrDied, k.ExitErr())
	case <-ctx.Done():
		k.Shutdown()
		return nil, ctx.Err()
	case <-time.After(spec.StartWithin()):
		k.Shutdown()
		return nil, fmt.Errorf("%s did not start", rs.name)
	}
}

// writeRunner puts a runner file in dir by renaming a complete copy over it: a context starting
// at the same time may be reading it, and must never see it half written.
func writeRunner(dir, name string, body []byte) (string, error) {
	script := filepath.Join(dir, name)
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), script)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return script, nil
}

func (k *nodeKernel) readEvents(r *os.File, ready chan struct{}) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev nodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			k.log.Warn("bad event from a runner", "runner", k.name, "err", err)
			continue
		}
		if ev.Type == "ready" {
			// Once: a cell can write to fd 3 too.
			if ready != nil {
				close(ready)
				ready = nil
			}
			continue
		}
		if ev.ID == nil {
			continue // output between cells (a timer's console.log): nobody to give it to
		}
		k.mu.Lock()
		ch := k.waiters[*ev.ID]
		k.mu.Unlock()
		if ch != nil {
			select {
			case ch <- ev:
			case <-k.Exited():
				return
			}
		}
	}
}

// write sends one line to the runner.
func (k *nodeKernel) write(line []byte) error {
	k.writeMu.Lock()
	defer k.writeMu.Unlock()
	_, err := k.stdin.Write(append(line, '\n'))
	return err
}

func (k *nodeKernel) Execute(ctx context.Context, code string, silent bool, emit func(jupyter.Output)) (jupyter.Reply, error) {
	k.mu.Lock()
	k.seq++
	id := strconv.Itoa(k.seq)
	ch := make(chan nodeEvent, 64)
	k.waiters[id] = ch
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.waiters, id)
		k.mu.Unlock()
	}()
	req := k.encode(id, code)
	// A large cell fills the pipe and waits for the runner to read it, which a runner busy
	// outside any cell (a timer that spins) never does: when the client leaves first, the
	// runner is as stuck as one that ignores an interrupt (Shutdown ends the write).
	written := make(chan error, 1)
	go func() { written <- k.write(req) }()
	var err error
	select {
	case err = <-written:
	case <-ctx.Done():
		select {
		case err = <-written: // taken after all: awaitCell interrupts it at once
		case <-time.After(jupyter.InterruptGrace):
			return jupyter.Reply{Interrupted: true}, fmt.Errorf("%w (%s did not take the cell)", jupyter.ErrStuck, k.name)
		}
	}
	if err != nil {
		return jupyter.Reply{}, fmt.Errorf("%w: %v", jupyter.ErrDied, err)
	}
	var reply jupyter.Reply
	status := "ok"
	var soft func()
	if k.interrupt != nil {
		soft = func() {
			// In the background: a runner that reads nothing must not hold up the signal.
			go func() { _ = k.write(k.interrupt(id)) }()
		}
	}
	reply.Interrupted, err = awaitCell(ctx, &k.Process, k.name, soft, ch, func(ev nodeEvent) bool {
		switch ev.Type {
		case "stream":
			if !silent {
				emit(jupyter.Output{Kind: "stream", Stream: ev.Name, Text: ev.Text})
			}
		case "result":
			if !silent {
				emit(jupyter.Output{Kind: "result", Data: map[string]any{"text/plain": ev.Text}, Main: true})
			}
		case "error":
			status = "error"
			if !silent {
				emit(jupyter.Output{Kind: "error", EName: ev.Name, EValue: ev.Value, Traceback: []string{ev.Stack}})
			}
		case "done":
			reply.Status, reply.Count = status, ev.Count
			if !silent {
				emit(jupyter.Output{Kind: "count", Count: ev.Count})
			}
			return true
		}
		return false
	})
	return reply, err
}

func (k *nodeKernel) Shutdown() {
	k.Kill()
	_ = k.stdin.Close()
}
