package process

import (
	"strings"
	"testing"
)

func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"/bin/bash", []string{"-l", "-c", "echo hi"}, "echo hi"},
		{"/bin/sh", []string{"-c", "ls"}, "ls"},
		{"/bin/bash", []string{"script.sh", "-c", "x"}, "/bin/bash script.sh -c x"},
		{"/usr/bin/python3", []string{"-c", "print(1)"}, "/usr/bin/python3 -c print(1)"},
	} {
		if got := commandLine(c.cmd, c.args); got != c.want {
			t.Errorf("commandLine(%q, %q) = %q, want %q", c.cmd, c.args, got, c.want)
		}
	}
	if got := short(strings.Repeat("ab ", 200)); len(got) > maxCommand+len("…") {
		t.Errorf("short: %d bytes", len(got))
	}
}

func TestLineSplitter(t *testing.T) {
	var s lineSplitter
	var got []string
	emit := func(b []byte) { got = append(got, string(b)) }
	s.feed([]byte("one\ntw"), emit)
	s.feed([]byte("o\n\nthr"), emit)
	s.feed([]byte(strings.Repeat("x", maxTapLine)), emit)
	s.flush(emit)
	if len(got) != 4 || got[0] != "one" || got[1] != "two" || got[2] != "" || !strings.HasPrefix(got[3], "thrxx") {
		t.Fatalf("%q", got)
	}
}

type recorder struct{ msgs []string }

func (r *recorder) Add(level, _ string, msg string, _ map[string]string) {
	r.msgs = append(r.msgs, level+" "+msg)
}

func TestOutputTapSamplesAFlood(t *testing.T) {
	r := &recorder{}
	tap := newOutputTap(r, 7)
	for i := 0; i < 1000; i++ {
		tap.line(kindStdout, []byte("line"))
	}
	if len(r.msgs) > tapBurst+5 || len(r.msgs) < tapBurst {
		t.Fatalf("%d entries for a flood of 1000 lines", len(r.msgs))
	}
	tap.last = tap.last.Add(-2 * tapReportAt)
	tap.reported = tap.reported.Add(-2 * tapReportAt)
	tap.line(kindStderr, []byte("after"))
	last := r.msgs[len(r.msgs)-2:]
	if !strings.HasPrefix(last[0], "warn ") || !strings.Contains(last[0], "lines of the start command's output were not logged") || last[1] != "warn after" {
		t.Fatalf("%q", last)
	}
}
