package driver

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
)

type recordedOp struct {
	op, template string
	ok           bool
}

type recordingObserver struct {
	mu   sync.Mutex
	ops  []recordedOp
	made int
}

func (r *recordingObserver) SandboxOp(op, template string, _ time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, recordedOp{op, template, err == nil})
}

func (r *recordingObserver) SandboxesMade(_ string, count int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.made += count
}

// Every create, pause and resume is reported once, whoever asked: a resume by connect and a
// refused create included.
func TestObserverSeesEveryOperation(t *testing.T) {
	ctx := context.Background()
	obs := &recordingObserver{}
	e := newEnv(t, func(o *Options) { o.Node = drivertest.NewPausingNode(); o.Observer = obs })
	sb := e.create(t, CreateRequest{})
	if err := e.d.Pause(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := e.d.Connect(ctx, sb.ID, nil, true); err != nil || !resumed {
		t.Fatalf("connect: resumed %v, %v", resumed, err)
	}
	if _, err := e.d.Create(ctx, CreateRequest{Template: "nosuchtemplate"}); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("create from an unknown template: %v", err)
	}
	want := []recordedOp{{"create", sb.TemplateID, true}, {"pause", sb.TemplateID, true}, {"resume", sb.TemplateID, true}, {"create", "", false}}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.ops) != len(want) {
		t.Fatalf("observed %+v, want %+v", obs.ops, want)
	}
	for i := range want {
		if obs.ops[i] != want[i] {
			t.Fatalf("observed %+v, want %+v", obs.ops, want)
		}
	}
}
