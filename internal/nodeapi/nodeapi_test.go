package nodeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

// serve puts n behind a real HTTP server and returns a client of it.
func serve(t *testing.T, n driver.Node, features ...string) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(NewServer(n, func() Status { return Status{Features: features, FreeSlots: 3, Templates: []string{"tpl"}} }).Handler())
	ts := httptest.NewUnstartedServer(mux)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return NewClient(ts.Client(), ts.URL)
}

// errNode fails every call with err.
type errNode struct{ err error }

func (e errNode) CreateSandbox(context.Context, node.CreateSpec) (node.Info, error) {
	return node.Info{}, e.err
}
func (e errNode) DestroySandbox(context.Context, string) error              { return e.err }
func (e errNode) UpdateEgress(context.Context, string, egress.Policy) error { return e.err }
func (e errNode) PauseSandbox(context.Context, string, bool) (node.PauseInfo, error) {
	return node.PauseInfo{}, e.err
}

func TestErrorsKeepTheirKindAcrossTheWire(t *testing.T) {
	lost := fmt.Errorf("%w: %w", node.ErrSandboxLost, errors.New("runsc: /var/lib/vmon/x: boom"))
	for _, c := range []struct {
		name     string
		err      error
		kind     errdefs.Kind
		msg      string
		code     string
		sentinel error
	}{
		{"not found", errdefs.NotFound("sandbox %q not found", "sb1"), errdefs.KindNotFound, `sandbox "sb1" not found`, "", nil},
		{"invalid", errdefs.InvalidArgument("bad cpu"), errdefs.KindInvalidArgument, "bad cpu", "", nil},
		{"conflict", errdefs.Conflict("already paused"), errdefs.KindConflict, "already paused", "", nil},
		{"capacity with E2B's code", errdefs.WithCode(errdefs.ResourceExhausted("node full"), driver.CapacityErrorCode),
			errdefs.KindResourceExhausted, "node full", driver.CapacityErrorCode, nil},
		{"insufficient storage", errdefs.InsufficientStorage("snapshots full"), errdefs.KindInsufficientStorage, "snapshots full", "", nil},
		{"unavailable", errdefs.Unavailable("no envd"), errdefs.KindUnavailable, "no envd", "", nil},
		{"data loss", errdefs.DataLoss("damaged snapshot"), errdefs.KindDataLoss, "damaged snapshot", "", nil},
		{"kinded, internal cause kept home", errdefs.Wrap(errdefs.KindUnavailable, errors.New("/host/path"), "sandbox did not start"),
			errdefs.KindUnavailable, "sandbox did not start", "", nil},
		{"lost (no kind)", lost, errdefs.KindUnknown, lost.Error(), "", node.ErrSandboxLost},
		{"paused, kinded", errdefs.Wrap(errdefs.KindConflict, node.ErrSandboxPaused, "it was paused"), errdefs.KindConflict, "it was paused", "", node.ErrSandboxPaused},
		{"not implemented", fmt.Errorf("pauses are %w", driver.ErrNotImplemented), errdefs.KindUnknown, "pauses are not supported yet", "", driver.ErrNotImplemented},
		{"plain", errors.New("disk on fire"), errdefs.KindUnknown, "disk on fire", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := serve(t, errNode{c.err})
			_, err := cl.CreateSandbox(context.Background(), node.CreateSpec{ID: "sb1"})
			if err == nil {
				t.Fatal("no error")
			}
			if k := errdefs.KindOf(err); k != c.kind {
				t.Errorf("kind %v, want %v (%v)", k, c.kind, err)
			}
			var e *errdefs.Error
			if c.kind != errdefs.KindUnknown {
				if !errors.As(err, &e) || e.Msg != c.msg || e.Code != c.code {
					t.Errorf("got %#v, want message %q code %q", e, c.msg, c.code)
				}
			} else if err.Error() != c.msg {
				t.Errorf("message %q, want %q", err.Error(), c.msg)
			}
			if c.sentinel != nil && !errors.Is(err, c.sentinel) {
				t.Errorf("%v does not match %v", err, c.sentinel)
			}
		})
	}
	// A node that is not there is Unavailable, not a hang or an Unknown.
	down := NewClient(http.DefaultClient, "http://127.0.0.1:1")
	if err := down.DestroySandbox(context.Background(), "x"); errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Errorf("unreachable node: %v", err)
	}
	// A part the node does not serve is 501 for the driver.
	cl := serve(t, drivertest.NewNode())
	if _, err := cl.PauseSandbox(context.Background(), "x", true); !errors.Is(err, driver.ErrNotImplemented) {
		t.Errorf("pause on a node without pauses: %v", err)
	}
}

// fullNode records what it is given and implements every part of the contract.
type fullNode struct {
	*drivertest.PausingNode
	mu      sync.Mutex
	snaps   []string
	denied  chan node.DeniedEvent
	metrics node.Metrics
}

func (f *fullNode) SnapshotSandbox(_ context.Context, id, snapID string) (node.PauseInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps = append(f.snaps, id+">"+snapID)
	return node.PauseInfo{Memory: true, Bytes: 42}, nil
}
func (f *fullNode) CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error) {
	f.mu.Lock()
	f.snaps = append(f.snaps, snapID+"|"+pausedID+">"+spec.ID)
	f.mu.Unlock()
	return f.CreateSandbox(ctx, spec)
}
func (f *fullNode) DeleteSnapshot(context.Context, string) error { return nil }
func (f *fullNode) SandboxMetrics(context.Context, string) (node.Metrics, error) {
	return f.metrics, nil
}
func (f *fullNode) WatchDenied(id string) ([]node.DeniedEvent, <-chan node.DeniedEvent, func(), error) {
	if id != "sb1" {
		return nil, nil, nil, errdefs.NotFound("sandbox %q not found", id)
	}
	return []node.DeniedEvent{{SandboxID: id, Dst: "203.0.113.1", Port: 443, Stage: "denyOut", Count: 1}}, f.denied, func() {}, nil
}

func TestEveryCallRoundTrips(t *testing.T) {
	ctx := context.Background()
	f := &fullNode{PausingNode: drivertest.NewPausingNode(), denied: make(chan node.DeniedEvent, 1),
		metrics: node.Metrics{Timestamp: time.Unix(1700000000, 0).UTC(), CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20, MemTotal: 512 << 20, DiskUsed: 3, DiskTotal: 4}}
	f.StartedAt = time.Unix(1700000000, 123).UTC()
	cl := serve(t, f, "net-tap", "egress-domains")
	info, err := cl.Info(ctx)
	if err != nil || !reflect.DeepEqual(info.Features, []string{"net-tap", "egress-domains"}) || info.FreeSlots != 3 || info.Templates[0] != "tpl" ||
		!reflect.DeepEqual(info.Capabilities, []string{CapPause, CapSnapshot, CapMetrics, CapDenied}) {
		t.Fatalf("info %+v %v", info, err)
	}
	spec := node.CreateSpec{ID: "sb1", TemplateID: "tpl", BuildID: "b1", CPUs: 2, MemoryMB: 512, DiskMB: 1024,
		EnvVars: map[string]string{"A": "1"}, AccessToken: "tok", DefaultUser: "user", DefaultWorkdir: "/home/user",
		Egress: egress.Policy{AllowOut: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
			DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, AllowDomains: []string{"*.example.com"},
			Rules: []egress.HeaderRule{{Domain: "api.example.com", Headers: map[string]string{"X-Key": "v"}}},
			Proxy: &egress.Proxy{Address: "proxy.example:1080", Username: "u", Password: "p", TLS: true}},
		Volumes: []node.VolumeMount{{ID: "vol1", Path: "/data"}}}
	got, err := cl.CreateSandbox(ctx, spec)
	if err != nil || got.ID != "sb1" || !got.StartedAt.Equal(f.StartedAt) || got.EnvdVersion != "0.6.13" {
		t.Fatalf("create: %+v %v", got, err)
	}
	if arrived, _ := f.Spec("sb1"); !reflect.DeepEqual(arrived, spec) {
		t.Fatalf("the node got\n%+v\nwant\n%+v", arrived, spec)
	}
	p := egress.Policy{DenyOut: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	if err := cl.UpdateEgress(ctx, "sb1", p); err != nil {
		t.Fatal(err)
	}
	if u := f.Updates(); len(u) != 1 || !reflect.DeepEqual(u[0].Policy, p) {
		t.Fatalf("updates %+v", u)
	}
	if m, err := cl.SandboxMetrics(ctx, "sb1"); err != nil || m != f.metrics {
		t.Fatalf("metrics %+v %v", m, err)
	}
	if pi, err := cl.SnapshotSandbox(ctx, "sb1", "snap1"); err != nil || pi != (node.PauseInfo{Memory: true, Bytes: 42}) {
		t.Fatalf("snapshot %+v %v", pi, err)
	}
	spec2 := spec
	spec2.ID = "sb2"
	if _, err := cl.CreateFromSnapshot(ctx, spec2, "snap1", ""); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.snaps, []string{"sb1>snap1", "snap1|>sb2"}) {
		t.Fatalf("snapshots %q", f.snaps)
	}
	if pi, err := cl.PauseSandbox(ctx, "sb1", true); err != nil || !pi.Memory {
		t.Fatalf("pause %+v %v", pi, err)
	}
	if _, err := cl.ResumeSandbox(ctx, spec, true); err != nil || !f.Alive("sb1") {
		t.Fatalf("resume: %v", err)
	}
	recent, next, cancel, err := cl.WatchDenied("sb1")
	if err != nil || len(recent) != 1 || recent[0].Dst != "203.0.113.1" || recent[0].Port != 443 {
		t.Fatalf("watch: %+v %v", recent, err)
	}
	f.denied <- node.DeniedEvent{SandboxID: "sb1", Dst: "203.0.113.2", Count: 3, Repeats: true}
	select {
	case e := <-next:
		if e.Dst != "203.0.113.2" || e.Count != 3 || !e.Repeats {
			t.Fatalf("next %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no refusal through the stream")
	}
	cancel()
	if _, _, _, err := cl.WatchDenied("nope"); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("watch of an unknown sandbox: %v", err)
	}
	if err := cl.DestroySandbox(ctx, "sb1"); err != nil || f.Alive("sb1") {
		t.Fatalf("destroy: %v", err)
	}
}

// TestTheDriverCannotTell runs the driver over a node across the wire: create, network update,
// pause, resume, kill, and a failed create that leaves nothing behind.
func TestTheDriverCannotTell(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().UTC()
	if err := st.PutTemplate(ctx, store.Template{ID: "basetemplate00000001", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512,
		DiskMB: 2048, EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	pn := drivertest.NewPausingNode()
	features := []string{driver.FeatureNetTap, egress.FeatureDomains}
	d, err := driver.New(driver.Options{Store: st, Node: serve(t, pn, features...), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NodeID: "node1", Features: features})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true, EnvVars: map[string]string{"K": "v"},
		Network: &driver.Network{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	spec, ok := pn.Spec(sb.ID)
	if !ok || spec.EnvVars["K"] != "v" || len(spec.Egress.AllowDomains) != 1 || spec.AccessToken == "" {
		t.Fatalf("the node got %+v", spec)
	}
	if err := d.UpdateNetwork(ctx, sb.ID, driver.NetworkUpdate{DenyOut: []string{"198.51.100.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if u := pn.Updates(); len(u) != 1 || u[0].Policy.DenyOut[0].String() != "198.51.100.0/24" {
		t.Fatalf("the node's updates: %+v", u)
	}
	if err := d.Pause(ctx, sb.ID, true); err != nil || !pn.Paused(sb.ID) {
		t.Fatalf("pause: %v", err)
	}
	if _, err := d.Resume(ctx, sb.ID, nil); err != nil || !pn.Alive(sb.ID) {
		t.Fatalf("resume: %v", err)
	}
	if err := d.Kill(ctx, sb.ID); err != nil || pn.Alive(sb.ID) {
		t.Fatalf("kill: %v", err)
	}
	// The node's capacity error reaches the API as E2B's, with its code.
	pn.Set(func(n *drivertest.Node) {
		n.CreateErr = errdefs.WithCode(errdefs.ResourceExhausted("the node is full"), driver.CapacityErrorCode)
	})
	_, err = d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
	var e *errdefs.Error
	if !errors.As(err, &e) || e.Kind != errdefs.KindResourceExhausted || e.Code != driver.CapacityErrorCode {
		t.Fatalf("create on a full node: %#v", err)
	}
}

type listingNode struct {
	*drivertest.PausingNode
}

func (listingNode) ListSandboxes(context.Context) (Holdings, error) {
	return Holdings{Running: []string{"a", "b"}, Paused: []string{"c"}}, nil
}

// What a node holds crosses the wire; a node that cannot say answers ErrNotImplemented.
func TestListSandboxes(t *testing.T) {
	h, err := serve(t, listingNode{drivertest.NewPausingNode()}).ListSandboxes(context.Background())
	if err != nil || !slices.Equal(h.Running, []string{"a", "b"}) || !slices.Equal(h.Paused, []string{"c"}) {
		t.Fatalf("holdings %+v, %v", h, err)
	}
	if _, err := serve(t, drivertest.NewPausingNode()).ListSandboxes(context.Background()); !errors.Is(err, driver.ErrNotImplemented) {
		t.Fatalf("a node without lists: %v", err)
	}
}
