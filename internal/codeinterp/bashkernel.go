package codeinterp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// Bash runs cells in one bash process per context: variables, functions and the working
// directory carry over from cell to cell, as in a terminal. Each cell is sourced from a file with
// stdin closed; markers written after it on stdout and stderr end its output.
func Bash(bash string) Language {
	return Language{
		Start: func(ctx context.Context, spec jupyter.Spec) (kernel, error) { return startBash(ctx, bash, spec) },
		SetEnv: func(env map[string]string) (string, string) {
			var set, restore bytes.Buffer
			for _, k := range sortedKeys(env) {
				q := shellQuote(k)
				fmt.Fprintf(&set, "if [ -n \"${%s+x}\" ]; then __vmon_saved_%s=%s; else unset __vmon_saved_%s; fi\n", k, k, "\"$"+k+"\"", k)
				fmt.Fprintf(&set, "export %s=%s\n", k, shellQuote(env[k]))
				fmt.Fprintf(&restore, "if [ -n \"${__vmon_saved_%s+x}\" ]; then export %s=\"$__vmon_saved_%s\"; unset __vmon_saved_%s; else unset %s; fi\n", k, k, k, k, q)
			}
			return set.String(), restore.String()
		},
		ExportEnv: func(env map[string]string) string {
			var b bytes.Buffer
			for _, k := range sortedKeys(env) {
				fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(env[k]))
			}
			return b.String()
		},
	}
}

func shellQuote(s string) string {
	return "'" + string(bytes.ReplaceAll([]byte(s), []byte("'"), []byte(`'\''`))) + "'"
}

const bashMarker = "\x1evmon-end:"

const (
	noCell    = 0
	readyCell = -1
)

type bashKernel struct {
	jupyter.Process
	stdin io.WriteCloser
	dir   string
	out   chan bashChunk
	seq   int
	// listener is the cell waiting for output (readyCell during the start, noCell between
	// cells). Output between cells (a background job's) has nobody to go to and is dropped, so
	// bash's streams never back up. Each chunk carries the listener it was read under, because a
	// chunk read just before a cell ended can reach the channel after the next cell began.
	listener atomic.Int64
	// done is closed by Shutdown: output still on its way is dropped.
	done     chan struct{}
	doneOnce sync.Once
}

// bashChunk is output of one stream, or (end set) the marker that closes a cell on it.
type bashChunk struct {
	stream string
	text   string
	end    bool
	id     string
	code   int
	cell   int64 // the listener when the chunk was read
}

func startBash(ctx context.Context, bash string, spec jupyter.Spec) (_ kernel, err error) {
	dir, err := os.MkdirTemp(spec.RuntimeDir, "bash-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	k := &bashKernel{dir: dir, out: make(chan bashChunk, 256), done: make(chan struct{})}
	cmd := exec.Command(bash, "--noprofile", "--norc")
	cmd.Env, cmd.Dir = spec.Env, spec.Dir
	// Writers rather than pipes we read: Wait then returns once bash exits, even while a
	// background job it left still holds the streams (after exec's WaitDelay).
	cmd.Stdout, cmd.Stderr = &bashStream{k: k, name: "stdout"}, &bashStream{k: k, name: "stderr"}
	if k.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	k.listener.Store(readyCell)
	if err := k.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", bash, err)
	}
	// An interrupt ends the cell being sourced, not the shell. Until bash has run the trap, SIGINT
	// kills it, so the kernel is ready only once the marker written after the trap comes back.
	if _, err := fmt.Fprintf(k.stdin, "trap 'return 130 2>/dev/null' INT; printf '%sready:0\\n'\n", bashMarker); err != nil {
		k.Shutdown()
		return nil, fmt.Errorf("%w while starting: %v", jupyter.ErrDied, err)
	}
	deadline := time.NewTimer(spec.StartWithin())
	defer deadline.Stop()
	for {
		select {
		case c := <-k.out:
			if c.end && c.id == "ready" {
				k.listener.Store(noCell)
				return k, nil
			}
		case <-k.Exited():
			k.Shutdown()
			return nil, fmt.Errorf("%w while starting: %v", jupyter.ErrDied, k.ExitErr())
		case <-ctx.Done():
			k.Shutdown()
			return nil, ctx.Err()
		case <-deadline.C:
			k.Shutdown()
			return nil, errors.New("bash did not start")
		}
	}
}

// bashStream splits one of bash's streams into output and cell markers
// ("\x1evmon-end:<id>:<code>\n") for the cell in progress.
type bashStream struct {
	k    *bashKernel
	name string
	buf  []byte
}

func (s *bashStream) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	for len(s.buf) > 0 {
		i := bytes.IndexByte(s.buf, 0x1e)
		if i < 0 {
			s.send(bashChunk{text: string(s.buf)})
			s.buf = s.buf[:0]
			break
		}
		if i > 0 {
			s.send(bashChunk{text: string(s.buf[:i])})
			s.buf = s.buf[i:]
			continue
		}
		nl := bytes.IndexByte(s.buf, '\n')
		if nl < 0 && len(s.buf) < 64 && bytes.HasPrefix([]byte(bashMarker), s.buf[:min(len(s.buf), len(bashMarker))]) {
			break // maybe a marker: wait for the rest of it
		}
		if nl < 0 || !bytes.HasPrefix(s.buf, []byte(bashMarker)) {
			s.send(bashChunk{text: string(s.buf[:1])}) // a stray \x1e of the cell's own
			s.buf = s.buf[1:]
			continue
		}
		id, codeStr, _ := bytes.Cut(s.buf[len(bashMarker):nl], []byte(":"))
		code, _ := strconv.Atoi(string(codeStr))
		s.send(bashChunk{end: true, id: string(id), code: code})
		s.buf = s.buf[nl+1:]
	}
	return len(p), nil
}

func (s *bashStream) send(c bashChunk) {
	c.cell = s.k.listener.Load()
	if c.cell == noCell {
		return
	}
	c.stream = s.name
	select {
	case s.k.out <- c:
	case <-s.k.done:
	}
}

func (k *bashKernel) Execute(ctx context.Context, code string, silent bool, emit func(jupyter.Output)) (jupyter.Reply, error) {
	k.seq++
	id := strconv.Itoa(k.seq)
	cell := filepath.Join(k.dir, "cell-"+id+".sh")
	if err := os.WriteFile(cell, []byte(code+"\n"), 0o600); err != nil {
		return jupyter.Reply{}, err
	}
	defer os.Remove(cell)
	line := fmt.Sprintf("source %s </dev/null; printf '%s%s:%%d\\n' $?; printf '%s%s:0\\n' >&2\n",
		shellQuote(cell), bashMarker, id, bashMarker, id)
	cellNo := int64(k.seq)
	k.listener.Store(cellNo)
	defer k.listener.Store(noCell)
	if _, err := io.WriteString(k.stdin, line); err != nil {
		return jupyter.Reply{}, fmt.Errorf("%w: %v", jupyter.ErrDied, err)
	}
	reply := jupyter.Reply{Status: "ok", Count: k.seq}
	ended := map[string]bool{}
	exit := 0
	var err error
	reply.Interrupted, err = awaitCell(ctx, &k.Process, "bash", nil, k.out, func(c bashChunk) bool {
		switch {
		case c.cell != cellNo: // read before this cell began: a background job's, between cells
		case c.end && c.id == id:
			ended[c.stream] = true
			if c.stream == "stdout" {
				exit = c.code
			}
		case c.end: // a marker of an earlier, interrupted cell
		case !silent && c.text != "":
			emit(jupyter.Output{Kind: "stream", Stream: c.stream, Text: c.text})
		}
		return ended["stdout"] && ended["stderr"]
	})
	if err != nil {
		return reply, err
	}
	if !silent {
		emit(jupyter.Output{Kind: "count", Count: k.seq})
	}
	if exit != 0 && !reply.Interrupted {
		reply.Status = "error"
		if !silent {
			emit(jupyter.Output{Kind: "error", EName: "ExitCodeError", EValue: fmt.Sprintf("the cell exited with code %d", exit)})
		}
	}
	return reply, nil
}

func (k *bashKernel) Shutdown() {
	k.doneOnce.Do(func() { close(k.done) })
	k.Kill()
	_ = k.stdin.Close()
	_ = os.RemoveAll(k.dir)
}
