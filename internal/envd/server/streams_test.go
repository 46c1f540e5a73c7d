package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agentproto"
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
)

// Before a pause the node ends the open process streams with a reason: Start and Connect streams
// end with aborted and that reason, the process keeps running, a later stream is unaffected, and
// the endpoint wants the access token and a known reason.
func TestEndStreamsBeforeAPause(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, err := e.procJSON.Start(ctx, connect.NewRequest(shell("echo up; sleep 30")))
	if err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, start, func() *pb.ProcessEvent { return start.Msg().GetEvent() }, "up")
	list, err := e.procBin.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 {
		t.Fatalf("list = %v, %v", list, err)
	}
	pid := list.Msg.GetProcesses()[0].GetPid()
	conn, err := e.procBin.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil || !conn.Receive() || conn.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("connect: %v", err)
	}

	post := func(body, token string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+agentproto.EndStreamsPath, strings.NewReader(body))
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"reason":"nap"}`, ""); code != http.StatusBadRequest {
		t.Fatalf("unknown reason: %d", code)
	}
	e.initEnvd(t, map[string]any{"accessToken": "tok"})
	if code := post(`{"reason":"pause"}`, ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	if code := post(`{"reason":"pause"}`, "tok"); code != http.StatusNoContent {
		t.Fatalf("end streams: %d", code)
	}
	for name, s := range map[string]interface {
		Receive() bool
		Err() error
	}{"start": start, "connect": conn} {
		for s.Receive() {
		}
		if connectCode(s.Err()) != connect.CodeAborted || !strings.Contains(s.Err().Error(), "the sandbox was paused") {
			t.Fatalf("%s stream ended with %v, want aborted: the sandbox was paused", name, s.Err())
		}
	}
	// The process goes on, and a new stream to it is not ended by the earlier call.
	again, err := e.procBin.Connect(ctx, withToken(connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}), "tok"))
	if err != nil || !again.Receive() || again.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect after end-streams: %v", err)
	}
	if _, err := e.procBin.SendSignal(ctx, withToken(connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}), "tok")); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for again.Receive() {
		if ev := again.Msg().GetEvent(); ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if end == nil || end.GetStatus() != "signal: killed" {
		t.Fatalf("the reconnected stream ended with %v (%v), want the kill's end event", end, again.Err())
	}
}

func withToken[T any](req *connect.Request[T], token string) *connect.Request[T] {
	req.Header().Set("X-Access-Token", token)
	return req
}
