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
	}
}

func shellQuote(s string) string {
	return "'" + string(bytes.ReplaceAll([]byte(s), []byte("'"), []byte(`'\''`))) + "'"
}

const bashMarker = "\x1evmon-end:"

type bashKernel struct {
	jupyter.Process
	stdin io.WriteCloser
	dir   string
	out   chan bashChunk
	seq   int
}

// bashChunk is output of one stream, or (end set) the marker that closes a cell on it.
type bashChunk struct {
	stream string
	text   string
	end    bool
	id     string
	code   int
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
	k := &bashKernel{dir: dir, out: make(chan bashChunk, 256)}
	cmd := exec.Command(bash, "--noprofile", "--norc")
	cmd.Env, cmd.Dir = spec.Env, spec.Dir
	if k.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	if err := k.Start(cmd, wg.Wait); err != nil {
		return nil, fmt.Errorf("start %s: %w", bash, err)
	}
	go func() { defer wg.Done(); k.read("stdout", stdout) }()
	go func() { defer wg.Done(); k.read("stderr", stderr) }()
	// An interrupt ends the cell being sourced, not the shell. Until bash has run the trap, SIGINT
	// kills it, so the kernel is ready only once the marker written after the trap comes back.
	if _, err := fmt.Fprintf(k.stdin, "trap 'return 130 2>/dev/null' INT; printf '%sready:0\\n'\n", bashMarker); err != nil {
		k.Shutdown()
		return nil, fmt.Errorf("%w while starting: %v", jupyter.ErrDied, err)
	}
	timeout := spec.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case c := <-k.out:
			if c.end && c.id == "ready" {
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

// read splits one stream into output and cell markers ("\x1evmon-end:<id>:<code>\n").
func (k *bashKernel) read(stream string, r io.Reader) {
	buf := make([]byte, 0, 64<<10)
	tmp := make([]byte, 32<<10)
	for {
		n, err := r.Read(tmp)
		buf = append(buf, tmp[:n]...)
		for len(buf) > 0 {
			i := bytes.IndexByte(buf, 0x1e)
			if i < 0 {
				k.out <- bashChunk{stream: stream, text: string(buf)}
				buf = buf[:0]
				break
			}
			if i > 0 {
				k.out <- bashChunk{stream: stream, text: string(buf[:i])}
				buf = buf[i:]
				continue
			}
			nl := bytes.IndexByte(buf, '\n')
			if nl < 0 && len(buf) < 64 && bytes.HasPrefix([]byte(bashMarker), buf[:min(len(buf), len(bashMarker))]) {
				break // maybe a marker: wait for the rest of it
			}
			if nl < 0 || !bytes.HasPrefix(buf, []byte(bashMarker)) {
				k.out <- bashChunk{stream: stream, text: string(buf[:1])} // a stray \x1e of the cell's own
				buf = buf[1:]
				continue
			}
			id, codeStr, _ := bytes.Cut(buf[len(bashMarker):nl], []byte(":"))
			code, _ := strconv.Atoi(string(codeStr))
			k.out <- bashChunk{stream: stream, end: true, id: string(id), code: code}
			buf = buf[nl+1:]
		}
		if err != nil {
			if len(buf) > 0 {
				k.out <- bashChunk{stream: stream, text: string(buf)}
			}
			return
		}
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
	if _, err := io.WriteString(k.stdin, line); err != nil {
		return jupyter.Reply{}, fmt.Errorf("%w: %v", jupyter.ErrDied, err)
	}
	reply := jupyter.Reply{Status: "ok", Count: k.seq}
	ended := map[string]bool{}
	exit := 0
	var err error
	reply.Interrupted, err = awaitCell(ctx, &k.Process, "bash", k.out, func(c bashChunk) bool {
		switch {
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
	k.Kill()
	_ = k.stdin.Close()
	_ = os.RemoveAll(k.dir)
}
