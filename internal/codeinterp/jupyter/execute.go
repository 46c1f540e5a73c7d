package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Output is one thing a running cell produced, in the order the kernel published it.
type Output struct {
	// Kind is "stream", "result", "error" or "count".
	Kind string
	// Stream is "stdout" or "stderr" for Kind "stream", with its Text.
	Stream, Text string
	// Data is a result's MIME bundle; Main says it is the cell's value (execute_result) rather
	// than a display (display_data).
	Data map[string]any
	Main bool
	// Error fields, for Kind "error".
	EName, EValue string
	Traceback     []string
	// Count is the execution count, for Kind "count".
	Count int
}

// Reply is how an execution ended.
type Reply struct {
	// Status is the kernel's: "ok", "error" or "aborted"; empty for an interrupted execution the
	// kernel ended without a reply.
	Status string
	// Count is the execution count.
	Count int
	// Interrupted says the run was interrupted because ctx ended.
	Interrupted bool
}

// Execute runs code and calls emit with each output as it is published. Silent runs record no
// history and publish nothing (setup code). When ctx ends first, the kernel is interrupted and
// Execute waits for it to settle, so the next execution finds it idle. A kernel that exits
// meanwhile ends it with ErrDied.
func (k *Kernel) Execute(ctx context.Context, code string, silent bool, emit func(Output)) (Reply, error) {
	msg, err := k.newMessage("execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent, "user_expressions": map[string]any{},
		// Executions reach a kernel one at a time, so there is no queue to abort on an error; with
		// stop_on_error ipykernel would also abort the next request if it came right after an
		// error (an interrupted run, then the client's next call).
		"allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return Reply{}, err
	}
	id := msg.Header.MsgID
	w := k.register(id)
	defer k.unregister(id)
	if err := k.send(msg); err != nil {
		return Reply{}, err
	}
	var reply Reply
	gotReply, idle := false, false
	done := ctx.Done()
	var grace, settled <-chan time.Time
	// settle starts the wait for a reply that may never come: ipykernel catches an interrupt that
	// lands outside the cell (flushing its output before the reply) itself, logs "KeyboardInterrupt
	// caught in kernel." and sends no execute_reply, yet goes idle with its state intact. The reply
	// goes out before the idle status, on another socket: ReplyAfterIdle is for its transit.
	settle := func() {
		if reply.Interrupted && idle && !gotReply && settled == nil {
			settled = time.After(ReplyAfterIdle)
		}
	}
	for !(gotReply && idle) {
		select {
		case m := <-w.iopub:
			if k.publish(m, emit) {
				idle = true
				settle()
			}
		case m := <-w.reply:
			gotReply = true
			var c struct {
				Status         string `json:"status"`
				ExecutionCount int    `json:"execution_count"`
			}
			_ = json.Unmarshal(m.Content, &c)
			reply.Status, reply.Count = c.Status, c.ExecutionCount
		case <-done:
			reply.Interrupted = true
			done = nil
			k.log.Info("interrupting the kernel: its client left or the timeout passed", "request", id, "err", context.Cause(ctx))
			if err := k.Interrupt(); err != nil {
				k.log.Warn("interrupt kernel", "err", err)
			}
			grace = time.After(InterruptGrace)
			settle()
		case <-settled:
			k.log.Info("the kernel went idle after an interrupt without replying: it caught the interrupt outside the cell", "request", id)
			return reply, nil
		case <-grace:
			return reply, ErrStuck
		case <-k.proc.Exited():
			return reply, fmt.Errorf("%w: %v", ErrDied, k.proc.ExitErr())
		}
	}
	return reply, nil
}

// publish hands one iopub message to emit and reports whether it was the status that ends the
// request.
func (k *Kernel) publish(m Message, emit func(Output)) (idle bool) {
	switch m.Header.MsgType {
	case "status":
		var c struct {
			State string `json:"execution_state"`
		}
		_ = json.Unmarshal(m.Content, &c)
		return c.State == "idle"
	case "execute_input":
		var c struct {
			Count int `json:"execution_count"`
		}
		if json.Unmarshal(m.Content, &c) == nil {
			emit(Output{Kind: "count", Count: c.Count})
		}
	case "stream":
		var c struct {
			Name string `json:"name"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &c) == nil {
			emit(Output{Kind: "stream", Stream: c.Name, Text: c.Text})
		}
	case "execute_result", "display_data", "update_display_data":
		var c struct {
			Data map[string]any `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) == nil && len(c.Data) > 0 {
			emit(Output{Kind: "result", Data: c.Data, Main: m.Header.MsgType == "execute_result"})
		}
	case "error":
		var c struct {
			EName     string   `json:"ename"`
			EValue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		if json.Unmarshal(m.Content, &c) == nil {
			emit(Output{Kind: "error", EName: c.EName, EValue: c.EValue, Traceback: c.Traceback})
		}
	}
	return false
}
