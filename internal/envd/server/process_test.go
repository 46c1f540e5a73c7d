package server_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/vibemon/vmon/internal/envd/gen/process"
)

func TestRunAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: checks that the default user is root (CI runs as root)")
	}
	e := startEnv(t)
	for name, c := range e.codecs() {
		t.Run(name, func(t *testing.T) {
			r := runCmd(t, c, connect.NewRequest(shell("echo hi && whoami")))
			if r.stdout != "hi\nroot\n" || r.end.GetExitCode() != 0 || !r.end.GetExited() || r.end.GetStatus() != "exit status 0" {
				t.Fatalf("got stdout %q end %v", r.stdout, r.end)
			}
			if r.end.Error != nil {
				t.Fatalf("error set on success: %q", r.end.GetError())
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	e := startEnv(t)
	for name, c := range e.codecs() {
		t.Run(name, func(t *testing.T) {
			r := runCmd(t, c, connect.NewRequest(shell("echo oops >&2; exit 7")))
			if r.end.GetExitCode() != 7 || !r.end.GetExited() || r.end.GetError() != "exit status 7" || r.stderr != "oops\n" {
				t.Fatalf("got %+v stderr %q", r.end, r.stderr)
			}
			r = runCmd(t, c, connect.NewRequest(shell("kill -9 $$")))
			if r.end.GetExitCode() != -1 || r.end.GetExited() || r.end.GetStatus() != "signal: killed" {
				t.Fatalf("killed: got %+v", r.end)
			}
		})
	}
}

func TestRunAsUser(t *testing.T) {
	u := needTestUser(t)
	e := startEnv(t)
	r := runCmd(t, e.procJSON, asUser(connect.NewRequest(shell(`whoami; pwd; id -u; id -G; echo "$HOME $USER $LOGNAME"; touch owned.txt`)), u.Name))
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 {
		t.Fatalf("stdout %q", r.stdout)
	}
	if lines[0] != u.Name || lines[1] != u.Home || lines[2] != strconv.Itoa(int(u.UID)) ||
		lines[4] != u.Home+" "+u.Name+" "+u.Name {
		t.Fatalf("stdout %q for user %+v", r.stdout, u)
	}
	groups := strings.Fields(lines[3])
	for _, g := range u.Groups {
		if !slices.Contains(groups, strconv.Itoa(int(g))) {
			t.Fatalf("groups %v miss %d (want %v)", groups, g, u.Groups)
		}
	}
	// The default user is switchable by /init.
	e.initEnvd(t, map[string]any{"defaultUser": u.Name})
	r = runCmd(t, e.procBin, connect.NewRequest(shell("whoami")))
	if strings.TrimSpace(r.stdout) != u.Name {
		t.Fatalf("default user: %q", r.stdout)
	}
	// Unknown users are unauthenticated.
	stream, err := e.procJSON.Start(context.Background(), asUser(connect.NewRequest(shell("true")), "no-such-user-envd"))
	if err == nil {
		r := collect(t, stream)
		err = r.err
	}
	if connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown user: %v", err)
	}
}

func TestEnvPrecedence(t *testing.T) {
	e := startEnv(t)
	e.initEnvd(t, map[string]any{"envVars": map[string]string{"A": "init", "B": "init", "PATH": "/init/bin:/usr/bin:/bin"}})
	// env(1) without a login shell shows exactly what envd passed (a login shell rewrites PATH).
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "env", Envs: map[string]string{"B": "req", "C": "req"}}}
	r := runCmd(t, e.procJSON, connect.NewRequest(req))
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	want := map[string]string{"A": "init", "B": "req", "C": "req", "PATH": "/init/bin:/usr/bin:/bin", "USER": "root", "LOGNAME": "root", "HOME": "/root"}
	if os.Geteuid() != 0 {
		delete(want, "USER")
		delete(want, "LOGNAME")
		delete(want, "HOME")
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (env %v)", k, got[k], v, got)
		}
	}
	// Request envs apply to that process only.
	r = runCmd(t, e.procBin, connect.NewRequest(shell(`echo "$A $B [$C]"`)))
	if got := strings.TrimSpace(r.stdout); got != "init init []" {
		t.Fatalf("request env leaked: %q", got)
	}
}

// A request env or argument longer than execve takes is the client's invalid_argument naming it,
// not "fork/exec: file name too long"; one byte less runs.
func TestOversizedEnvAndArgs(t *testing.T) {
	e := startEnv(t)
	const limit = 128<<10 - 1 // MAX_ARG_STRLEN without its NUL
	at := strings.Repeat("v", limit-len("BIG="))
	r := runCmd(t, e.procJSON, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
		Cmd: "/bin/sh", Args: []string{"-c", `echo ${#BIG}`}, Envs: map[string]string{"BIG": at}}}))
	if got := strings.TrimSpace(r.stdout); got != strconv.Itoa(len(at)) {
		t.Fatalf("env at the limit: got %q", got)
	}
	for _, tc := range []struct {
		name string
		cfg  *pb.ProcessConfig
		msg  string
	}{
		{"env one over", &pb.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"BIG": at + "v"}}, `envs: "BIG" is 131072 bytes`},
		{"env of 200 KiB", &pb.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"BIG": strings.Repeat("v", 200<<10)}}, `envs: "BIG"`},
		{"argument one over", &pb.ProcessConfig{Cmd: "/bin/echo", Args: []string{strings.Repeat("a", limit+1)}}, "argument 1 is 131072 bytes"},
		{"all together over 2 MiB", &pb.ProcessConfig{Cmd: "/bin/true", Envs: manyEnvs(20, 120<<10)}, "bytes in all, over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream, err := e.procJSON.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: tc.cfg}))
			if err == nil {
				err = collect(t, stream).err
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want invalid_argument containing %q", err, tc.msg)
			}
		})
	}
}

func manyEnvs(n, size int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m["E"+strconv.Itoa(i)] = strings.Repeat("x", size)
	}
	return m
}

func TestCwd(t *testing.T) {
	e := startEnv(t)
	dir := t.TempDir()
	req := shell("pwd")
	req.Process.Cwd = &dir
	if r := runCmd(t, e.procJSON, connect.NewRequest(req)); strings.TrimSpace(r.stdout) != dir {
		t.Fatalf("cwd: %q", r.stdout)
	}
	missing := filepath.Join(dir, "missing")
	req.Process.Cwd = &missing
	stream, err := e.procJSON.Start(context.Background(), connect.NewRequest(req))
	if err == nil {
		err = collect(t, stream).err
	}
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing cwd: %v", err)
	}
	// defaultWorkdir applies when the request has no cwd.
	e.initEnvd(t, map[string]any{"defaultWorkdir": dir})
	if r := runCmd(t, e.procBin, connect.NewRequest(shell("pwd"))); strings.TrimSpace(r.stdout) != dir {
		t.Fatalf("defaultWorkdir: %q", r.stdout)
	}
	if u := testUser; u != nil {
		rel := "."
		req := shell("pwd")
		req.Process.Cwd = &rel
		if r := runCmd(t, e.procJSON, asUser(connect.NewRequest(req), u.Name)); strings.TrimSpace(r.stdout) != u.Home {
			t.Fatalf("relative cwd: %q, want %q", r.stdout, u.Home)
		}
	}
}

func TestStdin(t *testing.T) {
	e := startEnv(t)
	for name, c := range e.codecs() {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			yes := true
			req := shell("cat; echo done")
			req.Stdin = &yes
			stream, err := c.Start(ctx, connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
				t.Fatalf("no start event: %v", stream.Err())
			}
			pid := stream.Msg().GetEvent().GetStart().GetPid()
			sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
			if _, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("line one\n")}}})); err != nil {
				t.Fatal(err)
			}
			receiveUntil(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, "line one")
			// PTY input to a pipe process is refused.
			_, err = c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}}))
			if connectCode(err) != connect.CodeInternal {
				t.Fatalf("pty input to pipe process: %v", err)
			}
			if _, err := c.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
				t.Fatal(err)
			}
			r := collectRest(t, stream)
			if r.err != nil || r.end == nil || r.end.GetExitCode() != 0 || r.stdout != "done\n" {
				t.Fatalf("after CloseStdin: %+v", r)
			}
		})
	}
	// stdin:false gives the process EOF at once.
	r := runCmd(t, e.procJSON, connect.NewRequest(shell("cat; echo eof")))
	if r.stdout != "eof\n" {
		t.Fatalf("stdin:false: %q", r.stdout)
	}
}

func TestSendSignal(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The shell's child (sleep) must get the signal too: it runs in the process's group.
	stream, err := e.procJSON.Start(ctx, connect.NewRequest(shell("sleep 30 & echo child=$!.; wait")))
	if err != nil {
		t.Fatal(err)
	}
	out := receiveUntil(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, ".")
	child, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(out, "child=")), "."))
	if err != nil {
		t.Fatalf("child pid from %q: %v", out, err)
	}
	list, err := e.procJSON.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	pid := list.Msg.GetProcesses()[0].GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.procJSON.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_UNSPECIFIED})); connectCode(err) != connect.CodeUnimplemented {
		t.Fatalf("unspecified signal: %v", err)
	}
	if _, err := e.procJSON.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	r := collectRest(t, stream)
	if r.err != nil || r.end == nil || r.end.GetStatus() != "signal: terminated" {
		t.Fatalf("after SIGTERM: %+v", r)
	}
	// Unknown pid: not_found (the SDK's kill() then returns false).
	gone := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.procBin.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: gone, Signal: pb.Signal_SIGNAL_SIGKILL})); connectCode(err) != connect.CodeNotFound {
		t.Fatalf("signal to exited process: %v", err)
	}
	waitGone(t, pid)
	waitGone(t, uint32(child)) // the shell's child got SIGTERM through the process group
}

func TestConnectTimeoutKillsProcess(t *testing.T) {
	e := startEnv(t)
	for name, c := range e.codecs() {
		t.Run(name, func(t *testing.T) {
			// connect-go sends the context deadline as Connect-Timeout-Ms.
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			stream, err := c.Start(ctx, connect.NewRequest(shell("sleep 10; echo finished")))
			if err != nil {
				t.Fatal(err)
			}
			r := collect(t, stream)
			if connectCode(r.err) != connect.CodeDeadlineExceeded || strings.Contains(r.stdout, "finished") {
				t.Fatalf("got %+v", r)
			}
			waitGone(t, r.pid)
		})
	}
}

func TestDisconnectKeepsProcessAndConnectReplays(t *testing.T) {
	e := startEnv(t)
	dir := t.TempDir()
	done := filepath.Join(dir, "done")
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.procJSON.Start(ctx, connect.NewRequest(shell("for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.2; done; touch "+done+"; exit 3")))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	cancel() // the client goes away
	_ = stream.Close()

	// A second client attaches to the running process and sees it to the end.
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	cs, err := e.procBin.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	var first *pb.ProcessEvent
	var out string
	var end *pb.ProcessEvent_EndEvent
	for cs.Receive() {
		ev := cs.Msg().GetEvent()
		if first == nil {
			first = ev
		}
		out += string(ev.GetData().GetStdout())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if cs.Err() != nil || first.GetStart().GetPid() != pid || end.GetExitCode() != 3 || !strings.Contains(out, "tick6") {
		t.Fatalf("connect: err %v first %v end %v out %q", cs.Err(), first, end, out)
	}
	if _, err := os.Stat(done); err != nil {
		t.Fatalf("process did not finish after the client disconnected: %v", err)
	}
	// Within the retention window, Connect replays start + end.
	cs2, err := e.procJSON.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	var evs []*pb.ProcessEvent
	for cs2.Receive() {
		evs = append(evs, cs2.Msg().GetEvent())
	}
	if cs2.Err() != nil || len(evs) != 2 || evs[0].GetStart().GetPid() != pid || evs[1].GetEnd().GetExitCode() != 3 {
		t.Fatalf("replay: %v %v", evs, cs2.Err())
	}
	// Unknown processes are not_found.
	cs3, err := e.procJSON.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 1 << 30}}}))
	if err == nil {
		for cs3.Receive() {
		}
		err = cs3.Err()
	}
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("connect unknown: %v", err)
	}
}

func TestPTY(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", `stty size; tty -s && echo is-a-tty; read line; echo "got:$line"; stty size`}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}
	stream, err := e.procJSON.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	receiveUntil(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, "is-a-tty")
	if _, err := e.procJSON.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	_, err = e.procJSON.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connectCode(err) != connect.CodeInternal {
		t.Fatalf("stdin input to a PTY process: %v", err)
	}
	if _, err := e.procJSON.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err == nil {
		t.Fatal("CloseStdin on a PTY process succeeded")
	}
	if _, err := e.procBin.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	r := collectRest(t, stream)
	if r.err != nil || r.end.GetExitCode() != 0 || !strings.Contains(r.pty, "got:hello") || !strings.Contains(r.pty, "30 100") {
		t.Fatalf("pty: %+v", r)
	}
	if r.stdout != "" || r.stderr != "" {
		t.Fatalf("PTY output must arrive as data.pty: %+v", r)
	}
}

func TestListAndTags(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tag := "my-tag"
	req := shell("sleep 30")
	req.Tag = &tag
	req.Process.Envs = map[string]string{"K": "V"}
	stream, err := e.procJSON.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	list, err := e.procBin.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ps := list.Msg.GetProcesses()
	if len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != tag || ps[0].GetConfig().GetCmd() != "/bin/bash" ||
		ps[0].GetConfig().GetEnvs()["K"] != "V" || !slices.Equal(ps[0].GetConfig().GetArgs(), []string{"-l", "-c", "sleep 30"}) {
		t.Fatalf("list: %v", ps)
	}
	byTag := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
	if _, err := e.procJSON.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: byTag, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r := collectRest(t, stream)
	if r.end == nil || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("after SIGKILL: %+v", r)
	}
	list, err = e.procJSON.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after exit: %v %v", list.Msg, err)
	}
}

func TestKeepalive(t *testing.T) {
	e := startEnv(t)
	req := connect.NewRequest(shell("sleep 2.5"))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	r := runCmd(t, e.procJSON, req)
	if r.keepalives < 1 {
		t.Fatalf("no keepalive in 2.5 s with a 1 s interval: %+v", r)
	}
}

func TestStreamInput(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	yes := true
	req := shell("head -c 10")
	req.Stdin = &yes
	stream, err := e.procBin.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	in := e.procBin.StreamInput(ctx)
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("01234")}}}}},
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("56789")}}}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	r := collectRest(t, stream)
	if r.stdout != "0123456789" {
		t.Fatalf("stream input: %+v", r)
	}
}

// A background child that inherited stdout keeps the pipe open; the end event must not wait for it.
func TestBackgroundChildDoesNotHoldEnd(t *testing.T) {
	e := startEnv(t)
	start := time.Now()
	r := runCmd(t, e.procJSON, connect.NewRequest(shell("sleep 5 & echo started")))
	if r.stdout != "started\n" || r.end.GetExitCode() != 0 || time.Since(start) > 3*time.Second {
		t.Fatalf("got %+v after %v", r, time.Since(start))
	}
}
