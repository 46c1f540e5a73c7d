package driver

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

var idRE = regexp.MustCompile(`^[a-z0-9]{20}$`)

func TestCreateValidation(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxTimeout = time.Hour })
	f := false
	for _, tc := range []struct {
		name    string
		req     CreateRequest
		kind    errdefs.Kind
		notImpl bool
		msg     string
	}{
		{name: "empty template", req: CreateRequest{Template: " "}, kind: errdefs.KindInvalidArgument, msg: "templateID is required"},
		{name: "unknown template", req: CreateRequest{Template: "nope"}, kind: errdefs.KindNotFound, msg: `template "nope" not found`},
		{name: "unknown tag", req: CreateRequest{Template: "base:v3"}, kind: errdefs.KindNotFound},
		{name: "template not ready", req: CreateRequest{Template: "wip"}, kind: errdefs.KindNotFound, msg: "not ready"},
		{name: "negative timeout", req: CreateRequest{Timeout: dur(-time.Second)}, kind: errdefs.KindInvalidArgument, msg: "must not be negative"},
		{name: "timeout above max", req: CreateRequest{Timeout: dur(time.Hour + time.Second)}, kind: errdefs.KindInvalidArgument, msg: "exceeds the maximum of 3600s"},
		{name: "env name empty", req: CreateRequest{EnvVars: map[string]string{"": "x"}}, kind: errdefs.KindInvalidArgument, msg: "envVars"},
		{name: "env name with =", req: CreateRequest{EnvVars: map[string]string{"A=B": "x"}}, kind: errdefs.KindInvalidArgument, msg: "envVars"},
		{name: "env value NUL", req: CreateRequest{EnvVars: map[string]string{"A": "x\x00"}}, kind: errdefs.KindInvalidArgument, msg: "NUL"},
		{name: "metadata empty key", req: CreateRequest{Metadata: map[string]string{"": "x"}}, kind: errdefs.KindInvalidArgument, msg: "metadata"},
		{name: "allowOut garbage", req: CreateRequest{Network: &Network{AllowOut: []string{"not a host!"}}}, kind: errdefs.KindInvalidArgument, msg: "network.allowOut[0]"},
		{name: "denyOut domain", req: CreateRequest{Network: &Network{DenyOut: []string{"example.com"}}}, kind: errdefs.KindInvalidArgument, msg: "network.denyOut[0]"},
		{name: "https port", req: CreateRequest{Network: &Network{HTTPSPorts: []int{0}}}, kind: errdefs.KindInvalidArgument, msg: "httpsPorts"},
		{name: "proxy address", req: CreateRequest{Network: &Network{EgressProxy: &EgressProxy{Address: "nohost"}}}, kind: errdefs.KindInvalidArgument, msg: "egressProxy"},
		{name: "rule domain", req: CreateRequest{Network: &Network{Rules: map[string][]NetworkRule{"bad domain": nil}}}, kind: errdefs.KindInvalidArgument, msg: "network.rules"},
		{name: "rule header", req: CreateRequest{Network: &Network{Rules: map[string][]NetworkRule{
			"api.example.com": {{Transform: &NetworkTransform{Headers: map[string]string{"bad header": "x"}}}}}}},
			kind: errdefs.KindInvalidArgument, msg: "header"},
		{name: "auto pause", req: CreateRequest{AutoPause: true}, notImpl: true},
		{name: "volumes", req: CreateRequest{VolumeMounts: []VolumeMountRequest{{Name: "v", Path: "/data"}}}, notImpl: true},
		{name: "private traffic and bad network", req: CreateRequest{Network: &Network{AllowPublicTraffic: &f, DenyOut: []string{"x"}}}, kind: errdefs.KindInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.req.Template == "" {
				tc.req.Template = "base"
			}
			_, err := e.d.Create(context.Background(), tc.req)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if tc.notImpl {
				if !errors.Is(err, ErrNotImplemented) {
					t.Fatalf("err = %v, want ErrNotImplemented", err)
				}
			} else {
				wantKind(t, err, tc.kind)
			}
			if tc.msg != "" && !strings.Contains(errdefs.PublicMessage(err), tc.msg) {
				t.Fatalf("message %q does not mention %q", errdefs.PublicMessage(err), tc.msg)
			}
		})
	}
	if n := e.countRecords(t); n != 0 {
		t.Fatalf("%d records left behind", n)
	}
	if len(e.node.Creates()) != 0 {
		t.Fatal("node was called for an invalid request")
	}
}

func TestCreate(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	f, tr := false, true
	sb := e.create(t, CreateRequest{
		Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"FOO": "bar"}, Secure: true,
		AllowInternetAccess: &tr,
	})
	if !idRE.MatchString(sb.ID) {
		t.Fatalf("id %q", sb.ID)
	}
	if sb.State != store.StateRunning || sb.TemplateID != baseID || sb.Alias != "base" ||
		sb.EnvdVersion != "0.6.13" || sb.CPU != 2 || sb.MemoryMB != 512 || sb.DiskMB != 2048 ||
		len(sb.EnvdAccessToken) != 32 || sb.TrafficAccessToken != "" || !sb.AllowPublicTraffic {
		t.Fatalf("sandbox = %+v", sb)
	}
	if !sb.EndAt.Equal(t0.Add(300 * time.Second)) {
		t.Fatalf("default end = %v", sb.EndAt)
	}
	spec, ok := e.node.Spec(sb.ID)
	if !ok || spec.EnvVars["FOO"] != "bar" || spec.AccessToken != sb.EnvdAccessToken ||
		spec.DefaultUser != "user" || spec.TemplateID != baseID || spec.CPUs != 2 || spec.MemoryMB != 512 {
		t.Fatalf("node spec = %+v", spec)
	}
	got, err := e.d.Get(ctx, sb.ID)
	if err != nil || got.Metadata["k"] != "v" || *got.AllowInternetAccess != true || !got.EndAt.Equal(sb.EndAt) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	r, err := e.d.SandboxByID(ctx, sb.ID)
	if err != nil || r.EnvdAccessToken != sb.EnvdAccessToken || r.NodeID != "node1" {
		t.Fatalf("SandboxByID = %+v, %v", r, err)
	}
	tpl, _ := e.store.GetTemplate(ctx, baseID)
	if tpl.SpawnCount != 1 {
		t.Fatalf("spawn count = %d", tpl.SpawnCount)
	}

	// Private traffic gets its own token; insecure (v1) sandboxes get no envd token.
	priv := e.create(t, CreateRequest{Network: &Network{AllowPublicTraffic: &f}, Timeout: dur(time.Minute)})
	if len(priv.TrafficAccessToken) != 32 || priv.AllowPublicTraffic || priv.EnvdAccessToken != "" ||
		priv.TrafficAccessToken == sb.EnvdAccessToken {
		t.Fatalf("private sandbox = %+v", priv)
	}
	if !priv.EndAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("end = %v", priv.EndAt)
	}
	routes, _ := e.d.RunningSandboxes(ctx)
	if len(routes) != 2 {
		t.Fatalf("routes = %+v", routes)
	}
}

func TestCreateTemplateNames(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct{ ref, alias string }{
		{"base", "base"},
		{"BASE", "base"},
		{"base:default", "base"},
		{"base:v2", "base:v2"},
		{"team/base", "base"},
		{"team/base:default", "base"},
		{baseID, "base"},
	} {
		sb := e.create(t, CreateRequest{Template: tc.ref})
		if sb.TemplateID != baseID || sb.Alias != tc.alias {
			t.Errorf("%q: template %q alias %q, want %q", tc.ref, sb.TemplateID, sb.Alias, tc.alias)
		}
	}
}

func TestTemplateCandidates(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"base", "base"},
		{"base:default", "base:default base"},
		{"base:v1", "base:v1 base"},
		{"ns/base", "ns/base base"},
		{"ns/base:v1", "ns/base:v1 ns/base base:v1 base"},
		{"ns/base:default", "ns/base:default ns/base base:default base"},
	} {
		if got := strings.Join(templateCandidates(tc.in), " "); got != tc.want {
			t.Errorf("templateCandidates(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCreateNodeFailure(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name string
		err  error
		kind errdefs.Kind
	}{
		{"kinded error passes through", drivertest.ErrBoot, errdefs.KindUnavailable},
		{"plain error becomes internal", errors.New("runsc: exit status 1 at /var/lib/vmon/x"), errdefs.KindUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.node.Set(func(n *drivertest.Node) { n.CreateErr = tc.err })
			_, err := e.d.Create(context.Background(), CreateRequest{Template: "base"})
			wantKind(t, err, tc.kind)
			if strings.Contains(errdefs.PublicMessage(err), "/var/lib") {
				t.Fatalf("public message leaks a host path: %q", errdefs.PublicMessage(err))
			}
			if n := e.countRecords(t); n != 0 {
				t.Fatalf("%d records left after failed create", n)
			}
			if routes, _ := e.d.RunningSandboxes(context.Background()); len(routes) != 0 {
				t.Fatalf("routes left: %+v", routes)
			}
		})
	}
	if got := e.node.Destroys(); len(got) != 2 {
		t.Fatalf("failed creates were not cleaned on the node: destroys %v", got)
	}
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxSandboxes = 2 })
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	e.create(t, CreateRequest{})
	_, err := e.d.Create(ctx, CreateRequest{Template: "base"})
	wantKind(t, err, errdefs.KindResourceExhausted)
	if errdefs.CodeOf(err) != CapacityErrorCode || !strings.Contains(errdefs.PublicMessage(err), "2 of 2") {
		t.Fatalf("capacity error = %v (code %q)", err, errdefs.CodeOf(err))
	}
	if e.countRecords(t) != 2 {
		t.Fatal("refused create left a record")
	}
	if err := e.d.Kill(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.create(t, CreateRequest{})
}

func TestCapacityConcurrent(t *testing.T) {
	// Concurrent creates must never overshoot the cap.
	e := newEnv(t, func(o *Options) { o.MaxSandboxes = 3; o.BootConcurrency = 8 })
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.d.Create(context.Background(), CreateRequest{Template: "base"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errdefs.Is(err, errdefs.KindResourceExhausted):
				full++
			default:
				t.Errorf("unexpected error %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || full != 7 || e.node.Running() != 3 {
		t.Fatalf("ok %d, full %d, running %d", ok, full, e.node.Running())
	}
}

func TestBootQueueTimeout(t *testing.T) {
	gate := make(chan struct{})
	e := newEnv(t, func(o *Options) { o.BootConcurrency = 1; o.BootQueueTimeout = 20 * time.Millisecond })
	e.node.Set(func(n *drivertest.Node) { n.Gate = gate; n.Entered = make(chan string, 10) })
	done := make(chan error, 1)
	go func() {
		_, err := e.d.Create(context.Background(), CreateRequest{Template: "base"})
		done <- err
	}()
	<-e.node.Entered // the first create holds the only slot
	_, err := e.d.Create(context.Background(), CreateRequest{Template: "base"})
	wantKind(t, err, errdefs.KindUnavailable)
	if !strings.Contains(errdefs.PublicMessage(err), "too many sandboxes are starting") {
		t.Fatalf("message = %q", errdefs.PublicMessage(err))
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("first create: %v", err)
	}
	if e.countRecords(t) != 1 {
		t.Fatalf("records = %d, want 1", e.countRecords(t))
	}
}

func TestCreateClientCancelWhileQueued(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	e := newEnv(t, func(o *Options) { o.BootConcurrency = 1 })
	e.node.Set(func(n *drivertest.Node) { n.Gate = gate; n.Entered = make(chan string, 10) })
	go e.d.Create(context.Background(), CreateRequest{Template: "base"})
	<-e.node.Entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.d.Create(ctx, CreateRequest{Template: "base"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n, _ := e.store.CountSandboxes(context.Background(), store.SandboxQuery{}); n != 1 {
		t.Fatalf("records = %d, want only the queued-ahead one", n)
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id, err := NewSandboxID()
		if err != nil {
			t.Fatal(err)
		}
		if !idRE.MatchString(id) || !ValidSandboxID(id) || seen[id] {
			t.Fatalf("bad or duplicate id %q", id)
		}
		seen[id] = true
	}
	for _, s := range []string{"", "ABC", "a-b", "a.b", strings.Repeat("a", 65)} {
		if ValidSandboxID(s) {
			t.Errorf("ValidSandboxID(%q) = true", s)
		}
	}
}

func TestCreateInputLimits(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	entry := func(n int) map[string]string { // one variable whose NAME=value is n bytes
		return map[string]string{"K": strings.Repeat("v", n-2)}
	}
	many := func(per, count int) map[string]string {
		m := map[string]string{}
		for i := 0; i < count; i++ {
			k := fmt.Sprintf("K%04d", i)
			m[k] = strings.Repeat("v", per-len(k)-1)
		}
		return m
	}
	meta := func(total int) map[string]string { return map[string]string{"k": strings.Repeat("m", total-1)} }
	for _, tc := range []struct {
		name string
		req  CreateRequest
		ok   bool
	}{
		{"env entry at the limit", CreateRequest{EnvVars: entry(MaxEnvVarBytes)}, true},
		{"env entry over the limit", CreateRequest{EnvVars: entry(MaxEnvVarBytes + 1)}, false},
		// 4 entries of 128 KiB - 1 bytes plus their separators: exactly the total limit.
		{"env total at the limit", CreateRequest{EnvVars: many(MaxEnvVarsBytes/4-1, 4)}, true},
		// 5 entries under the per-entry limit whose total is 2 bytes over.
		{"env total over the limit", CreateRequest{EnvVars: many(MaxEnvVarsBytes/5, 5)}, false},
		{"metadata at the limit", CreateRequest{Metadata: meta(MaxMetadataBytes)}, true},
		{"metadata over the limit", CreateRequest{Metadata: meta(MaxMetadataBytes + 1)}, false},
	} {
		tc.req.Template = "base"
		sb, err := e.d.Create(ctx, tc.req)
		if tc.ok {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			_ = e.d.Kill(ctx, sb.ID)
			continue
		}
		if !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		} else if msg := errdefs.PublicMessage(err); len(msg) > 512 {
			t.Errorf("%s: message of %d bytes", tc.name, len(msg))
		}
	}
	// A huge unknown id is NotFound with a short message.
	_, err := e.d.Get(ctx, strings.Repeat("a", 500_000))
	if !errdefs.Is(err, errdefs.KindNotFound) || len(errdefs.PublicMessage(err)) > 512 {
		t.Fatalf("huge id: %v", err)
	}
}
