package driver

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/sandboxlog"
)

// recLog records what the driver writes to sandbox logs.
type recLog struct {
	mu      sync.Mutex
	entries map[string][]sandboxlog.Entry
	ended   map[string]bool
}

func (r *recLog) Append(id string, e sandboxlog.Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[string][]sandboxlog.Entry{}
	}
	r.entries[id] = append(r.entries[id], e)
}

func (r *recLog) End(id string, e sandboxlog.Entry) {
	r.Append(id, e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended == nil {
		r.ended = map[string]bool{}
	}
	r.ended[id] = true
}

func (r *recLog) Query(id string, _ sandboxlog.Query) ([]sandboxlog.Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	es, ok := r.entries[id]
	if !ok {
		return nil, sandboxlog.ErrNotFound
	}
	return es, nil
}

func (r *recLog) lines(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.entries[id] {
		out = append(out, e.Level.String()+" "+e.Logger+" "+e.Message)
	}
	return out
}

func TestLifecycleIsLogged(t *testing.T) {
	rl := &recLog{}
	e, _ := newPausingEnv(t, func(o *Options) { o.Logs = rl })
	ctx := context.Background()
	sb := e.create(t, CreateRequest{EnvVars: map[string]string{"TOKEN": "s3cret-value"}})
	if err := e.d.Pause(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.ID, "paused")
	if _, _, err := e.d.Connect(ctx, sb.ID, dur(90*time.Second), true); err != nil {
		t.Fatal(err)
	}
	if err := e.d.SetTimeout(ctx, sb.ID, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	e.d.SandboxStopped(ctx, sb.ID, "oom: the sandbox ran out of memory")
	want := []string{
		"info lifecycleSvc sandbox created from template base",
		"info lifecycleSvc sandbox paused with its memory",
		"info lifecycleSvc sandbox resumed on node node1",
		"info lifecycleSvc sandbox timeout changed: it ends in 600 s",
		"error lifecycleSvc sandbox ended: oom: the sandbox ran out of memory",
	}
	if got := rl.lines(sb.ID); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	es := rl.entries[sb.ID]
	if f := es[0].Fields; f["template"] != baseID || f["cpu"] != "2" || f["memoryMB"] != "512" || f["timeout"] != "300" {
		t.Errorf("created fields %v", f)
	}
	if es[1].Fields["memory"] != "true" || es[2].Fields["memory"] != "true" {
		t.Errorf("pause/resume fields %v %v", es[1].Fields, es[2].Fields)
	}
	if !rl.ended[sb.ID] || es[4].Fields["reason"] != "oom: the sandbox ran out of memory" {
		t.Errorf("end: %v %v", rl.ended[sb.ID], es[4].Fields)
	}
	for _, e := range es {
		for _, v := range e.Fields {
			if strings.Contains(v, "s3cret") {
				t.Fatal("an environment value reached the log")
			}
		}
	}
	// An ended sandbox's log is still served; an unknown sandbox is NotFound.
	if got, err := e.d.Logs(ctx, sb.ID, sandboxlog.Query{}); err != nil || len(got) != 5 {
		t.Errorf("Logs of the ended sandbox: %d, %v", len(got), err)
	}
	if _, err := e.d.Logs(ctx, "nosuchsandbox", sandboxlog.Query{}); err == nil {
		t.Error("Logs of an unknown sandbox succeeded")
	}
}

func TestExpiryIsLogged(t *testing.T) {
	rl := &recLog{}
	e := newEnv(t, func(o *Options) { o.Logs = rl })
	sb := e.create(t, CreateRequest{Timeout: dur(time.Minute)})
	e.clock.Advance(2 * time.Minute)
	e.waitState(t, sb.ID, "killed")
	got := rl.lines(sb.ID)
	if len(got) != 2 || got[1] != "info lifecycleSvc sandbox ended: its timeout was reached" {
		t.Fatalf("log %q", got)
	}
}
