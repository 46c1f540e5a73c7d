package membership

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"testing"
	"time"
)

type recorder struct {
	mu  sync.Mutex
	evs []string
}

func (r *recorder) on(m Member, k EventKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, k.String()+" "+m.Name+" "+m.Meta.State)
}

func (r *recorder) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.evs {
		if e == s {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, timeout)
	return 0
}

func TestGossipMembershipMetaAndFailure(t *testing.T) {
	ctx := context.Background()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	var rec recorder
	driver, err := Start(ctx, Options{Name: "driver", Bind: "127.0.0.1:0", SecretKey: key, Local: true, OnEvent: rec.on,
		Meta: Meta{Role: RoleDriver, RPC: "127.0.0.1:9000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer driver.Shutdown()
	var nodes []*Cluster
	for _, name := range []string{"node-a", "node-b"} {
		n, err := Start(ctx, Options{Name: name, Bind: "127.0.0.1:0", SecretKey: key, Local: true, Join: []string{driver.LocalGossip()},
			Meta: Meta{Role: RoleNode, RPC: "127.0.0.1:1", State: StateReady, Features: []string{"net-tap", "egress-domains"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Shutdown()
		nodes = append(nodes, n)
	}
	waitFor(t, "everyone sees three members", 10*time.Second, func() bool {
		return len(driver.Members()) == 3 && len(nodes[0].Members()) == 3 && len(nodes[1].Members()) == 3
	})
	ms := driver.Members()
	if ms[1].Name != "node-a" || ms[1].Meta.Role != RoleNode || ms[1].Meta.Features[1] != "egress-domains" || ms[1].Meta.State != StateReady {
		t.Fatalf("members %+v", ms)
	}
	if !rec.has("joined node-a ready") || !rec.has("joined node-b ready") {
		t.Fatalf("events %v", rec.evs)
	}

	// A change of state reaches the driver.
	if err := nodes[0].SetMeta(Meta{Role: RoleNode, State: StateDraining}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain to reach the driver", 10*time.Second, func() bool { return rec.has("updated node-a draining") })

	// A member that stops answering (no leave message) is found out.
	_ = nodes[1].Shutdown()
	took := waitFor(t, "node-b's failure to be detected", 30*time.Second, func() bool { return rec.has("left node-b ready") })
	t.Logf("a silent member was detected after %s", took)
	if n := len(driver.Members()); n != 2 {
		t.Fatalf("%d members after a failure", n)
	}

	// Without the key, a stranger cannot join.
	_, err = Start(ctx, Options{Name: "stranger", Bind: "127.0.0.1:0", Local: true, Join: []string{driver.LocalGossip()}, Meta: Meta{Role: RoleNode}})
	if err == nil {
		t.Fatal("a member without the gossip key joined")
	}
	time.Sleep(500 * time.Millisecond)
	for _, m := range driver.Members() {
		if m.Name == "stranger" {
			t.Fatal("the stranger is listed")
		}
	}
}

func TestMetaBounded(t *testing.T) {
	_, err := Start(context.Background(), Options{Name: "big", Bind: "127.0.0.1:0", Local: true,
		Meta: Meta{Role: RoleNode, Features: []string{strings.Repeat("x", 600)}}})
	if err == nil || !strings.Contains(err.Error(), "past gossip's 512") {
		t.Fatalf("got %v", err)
	}
}
