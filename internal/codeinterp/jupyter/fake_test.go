package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// fakeKernel answers on the ports of the connection file Start writes, as a kernel would, and
// lets a test script what it publishes for an execute_request.
type fakeKernel struct {
	shell, iopub zmq4.Socket
	s            signer
	// onExecute publishes the outputs of one execution; parent is the request's header.
	onExecute func(f *fakeKernel, parent Header)
}

func (f *fakeKernel) publish(msgType string, parent Header, content any) {
	c, _ := json.Marshal(content)
	frames, _ := f.s.encode(Message{Header: Header{MsgID: newID(), MsgType: msgType, Version: protocolVersion}, Parent: parent, Content: c})
	_ = f.iopub.Send(zmq4.NewMsgFrom(append([][]byte{[]byte(msgType)}, frames...)...))
}

func (f *fakeKernel) serve(t *testing.T) {
	for {
		raw, err := f.shell.Recv()
		if err != nil {
			return
		}
		ident := raw.Frames[0]
		req, err := f.s.decode(raw.Frames)
		if err != nil {
			t.Errorf("fake kernel: %v", err)
			return
		}
		f.publish("status", req.Header, map[string]string{"execution_state": "busy"})
		replyType := "kernel_info_reply"
		reply := map[string]any{"status": "ok"}
		if req.Header.MsgType == "execute_request" {
			f.onExecute(f, req.Header)
			replyType, reply["execution_count"] = "execute_reply", 1
		}
		f.publish("status", req.Header, map[string]string{"execution_state": "idle"})
		c, _ := json.Marshal(reply)
		frames, _ := f.s.encode(Message{Header: Header{MsgID: newID(), MsgType: replyType, Version: protocolVersion}, Parent: req.Header, Content: c})
		_ = f.shell.Send(zmq4.NewMsgFrom(append([][]byte{ident}, frames...)...))
	}
}

// startFake starts a Kernel whose process is a placeholder and whose sockets reach f.
func startFake(t *testing.T, onExecute func(f *fakeKernel, parent Header)) *Kernel {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fakeKernel{onExecute: onExecute}
	go func() {
		// The connection file appears when Start runs; the fake binds its ports then.
		for ctx.Err() == nil {
			files, _ := filepath.Glob(filepath.Join(dir, "kernel-*.json"))
			if len(files) == 1 {
				b, err := os.ReadFile(files[0])
				var info connectionInfo
				if err == nil && json.Unmarshal(b, &info) == nil && info.Key != "" {
					f.s = signer{key: []byte(info.Key)}
					f.shell, f.iopub = zmq4.NewRouter(ctx), zmq4.NewPub(ctx)
					if err := f.shell.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", info.ShellPort)); err != nil {
						t.Errorf("fake shell: %v", err)
						return
					}
					if err := f.iopub.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", info.IOPubPort)); err != nil {
						t.Errorf("fake iopub: %v", err)
						return
					}
					f.serve(t)
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	k, err := Start(sctx, Spec{Argv: []string{"/bin/sleep", "3600"}, RuntimeDir: dir, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Shutdown)
	return k
}

// TestForeignParent: what the kernel publishes under a parent header no request has belongs to
// nobody: a status under it never ends the running execution, and its output is not the
// execution's.
func TestForeignParent(t *testing.T) {
	foreign := Header{MsgID: "not-a-request", MsgType: "execute_request"}
	k := startFake(t, func(f *fakeKernel, parent Header) {
		f.publish("status", foreign, map[string]string{"execution_state": "idle"})
		f.publish("execute_result", foreign, map[string]any{"data": map[string]any{"text/plain": "42"}, "execution_count": 1})
		f.publish("stream", parent, map[string]string{"name": "stdout", "text": "after\n"})
	})
	var outs []Output
	rep, err := k.Execute(context.Background(), "x", false, func(o Output) { outs = append(outs, o) })
	if err != nil || rep.Status != "ok" {
		t.Fatalf("execute: %+v %v", rep, err)
	}
	if len(outs) != 1 || outs[0].Kind != "stream" || outs[0].Text != "after\n" {
		t.Fatalf("outputs %+v: want only the execution's own stream, which the foreign idle did not cut off", outs)
	}
}
