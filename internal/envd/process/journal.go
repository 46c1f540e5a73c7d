package process

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/agentproto"

	pb "github.com/vibemon/vmon/internal/envd/gen/process"
)

// maxCommand bounds how much of a command line goes into a message; fields keep up to the
// journal's own bound.
const maxCommand = 200

// commandLine is what a user would call the process: the script of a shell's -c (every SDK
// command is `/bin/bash -l -c <script>`), else the program and its arguments.
func commandLine(cmd string, args []string) string {
	if base := filepath.Base(cmd); base == "bash" || base == "sh" || base == "dash" || base == "zsh" {
		for i, a := range args {
			if a == "-c" && i+1 < len(args) {
				return args[i+1]
			}
			if !strings.HasPrefix(a, "-") {
				break
			}
		}
	}
	return strings.TrimSpace(cmd + " " + strings.Join(args, " "))
}

func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxCommand {
		return s[:maxCommand] + "…"
	}
	return s
}

// journalStart records a started process: what runs, as whom, where. The environment never
// goes in: its values are the user's secrets.
func (s *Service) journalStart(p *proc, dir string) {
	if s.journal == nil {
		return
	}
	cmd := commandLine(p.config.GetCmd(), p.config.GetArgs())
	f := map[string]string{
		"pid":  strconv.FormatUint(uint64(p.pid), 10),
		"cmd":  p.config.GetCmd(),
		"args": strings.Join(p.config.GetArgs(), " "),
		"user": p.user,
		"cwd":  dir,
	}
	if p.tag != nil {
		f["tag"] = *p.tag
	}
	if p.ptmx != nil {
		f["pty"] = "true"
	}
	s.journal.Add(levelFor(p, "info"), journalLogger, fmt.Sprintf("process %d started: %s", p.pid, short(cmd)), f)
}

// journalEnd records how a process ended: its exit code, or the signal that killed it. A
// failure is a warning, as a user reading the log looks for those first.
func (s *Service) journalEnd(p *proc, end *pb.ProcessEvent_EndEvent) {
	if s.journal == nil {
		return
	}
	cmd := short(commandLine(p.config.GetCmd(), p.config.GetArgs()))
	f := map[string]string{
		"pid":      strconv.FormatUint(uint64(p.pid), 10),
		"exitCode": strconv.Itoa(int(end.GetExitCode())),
		"status":   end.GetStatus(),
	}
	if p.tag != nil {
		f["tag"] = *p.tag
	}
	level, msg := "info", fmt.Sprintf("process %d exited with code %d: %s", p.pid, end.GetExitCode(), cmd)
	if st := p.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			sig := ws.Signal()
			f["signal"] = unix.SignalName(sig)
			if f["signal"] == "" {
				f["signal"] = strconv.Itoa(int(sig))
			}
			level, msg = "warn", fmt.Sprintf("process %d was killed by %s: %s", p.pid, f["signal"], cmd)
		}
	}
	if level == "info" && end.GetExitCode() != 0 {
		level = "warn"
	}
	s.journal.Add(levelFor(p, level), journalLogger, msg, f)
}

// levelFor is level, or debug for the node's own commands (a ready command's failed attempts
// are how it waits, not news).
func levelFor(p *proc, level string) string {
	if t := p.tag; t != nil && *t != agentproto.StartCmdTag && strings.HasPrefix(*t, agentproto.InternalTagPrefix) {
		return "debug"
	}
	return level
}

// Output lines of the start command: a burst is logged whole, a steady flood is sampled, so a
// chatty server does not push everything else out of the sandbox's log.
const (
	tapBurst    = 200
	tapPerSec   = 20
	maxTapLine  = 1024
	tapReportAt = time.Second
)

// outputTap copies the start command's output lines into the journal, within a rate.
type outputTap struct {
	j   Journal
	pid string

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int
	reported   time.Time
}

func newOutputTap(j Journal, pid uint32) *outputTap {
	return &outputTap{j: j, pid: strconv.FormatUint(uint64(pid), 10), tokens: tapBurst, last: time.Now()}
}

func (t *outputTap) line(kind outputKind, l []byte) {
	stream := "stdout"
	switch kind {
	case kindStderr:
		stream = "stderr"
	case kindPTY:
		stream = "pty"
	}
	t.mu.Lock()
	now := time.Now()
	t.tokens = min(tapBurst, t.tokens+now.Sub(t.last).Seconds()*tapPerSec)
	t.last = now
	if t.tokens < 1 {
		t.suppressed++
		t.mu.Unlock()
		return
	}
	t.tokens--
	suppressed := 0
	if t.suppressed > 0 && now.Sub(t.reported) >= tapReportAt {
		suppressed, t.suppressed, t.reported = t.suppressed, 0, now
	}
	t.mu.Unlock()
	if suppressed > 0 {
		t.j.Add("warn", journalLogger, fmt.Sprintf("%d lines of the start command's output were not logged (at most %d a second)", suppressed, tapPerSec),
			map[string]string{"pid": t.pid, "suppressed": strconv.Itoa(suppressed)})
	}
	text := string(bytes.ToValidUTF8(bytes.TrimRight(l, "\r"), []byte("\uFFFD")))
	level := "info"
	if stream == "stderr" {
		level = "warn"
	}
	t.j.Add(level, journalLogger, text, map[string]string{"pid": t.pid, "stream": stream, "source": "start command"})
}

// lineSplitter cuts a byte stream into lines; a line longer than a read is cut at maxTapLine.
type lineSplitter struct{ partial []byte }

func (s *lineSplitter) feed(b []byte, emit func([]byte)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.partial = append(s.partial, b...)
			if len(s.partial) > maxTapLine {
				emit(s.partial)
				s.partial = s.partial[:0]
			}
			return
		}
		line := b[:i]
		if len(s.partial) > 0 {
			line = append(s.partial, line...)
			s.partial = s.partial[:0]
		}
		emit(line)
		b = b[i+1:]
	}
}

func (s *lineSplitter) flush(emit func([]byte)) {
	if len(s.partial) > 0 {
		emit(s.partial)
		s.partial = nil
	}
}
