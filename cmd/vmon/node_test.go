package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/join"
	"github.com/vibemon/vmon/internal/store"
)

func TestJoinTokenCommand(t *testing.T) {
	dir := t.TempDir()
	issue := func(args ...string) (string, error) {
		cmd := nodeCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"join-token", "--data-dir", dir}, args...))
		err := cmd.Execute()
		return strings.TrimSpace(out.String()), err
	}
	a, err := issue()
	if err != nil {
		t.Fatal(err)
	}
	b, err := issue("--uses", "3", "--ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	ta, err := join.ParseToken(a)
	if err != nil {
		t.Fatalf("%q: %v", a, err)
	}
	tb, err := join.ParseToken(b)
	if err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if ta.ID == tb.ID || ta.Secret == tb.Secret {
		t.Error("two tokens are the same")
	}
	if ta.Pin != tb.Pin {
		t.Error("the cluster CA changed between two tokens")
	}
	if _, err := issue("--ttl", "0s"); err == nil {
		t.Error("a token without a lifetime was issued")
	}
}

// `vmon node ls` and `vmon sandbox ls` show the nodes and where sandboxes run, a sandbox of a lost
// node as unreachable; `vmon node drain` records drains, and refuses a node nobody knows.
func TestNodeLsAndDrain(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	for _, n := range []store.Node{
		{Name: "node-a", RPC: "10.0.0.2:3001", State: store.NodeReady, Features: []string{"net-tap"}, FreeSlots: 3, SeenAt: t0, Since: t0},
		{Name: "node-b", RPC: "10.0.0.3:3001", State: store.NodeReady, SeenAt: t0, Since: t0},
	} {
		if err := st.UpsertNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for id, node := range map[string]string{"sandboxona00000000001": "node-a", "sandboxonb00000000001": "node-b"} {
		if err := st.InsertSandbox(ctx, store.Sandbox{ID: id, TemplateID: "base", State: store.StateRunning, CPU: 1, MemoryMB: 1,
			StartedAt: t0, EndAt: t0.Add(time.Hour), NodeID: node}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetNodeState(ctx, "node-b", store.NodeLost, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	run := func(root *cobra.Command, args ...string) (string, error) {
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--data-dir", dir))
		err := root.Execute()
		return out.String(), err
	}
	out, err := run(nodeCmd(), "ls", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var a nodeRow
	if err := json.Unmarshal([]byte(strings.Split(out, "\n")[0]), &a); err != nil || a.Name != "node-a" || a.Sandboxes != 1 || a.FreeSlots != 3 {
		t.Fatalf("node ls --json: %q %v", out, err)
	}
	if _, err := run(nodeCmd(), "drain", "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(nodeCmd(), "drain", "nobody"); err == nil || !strings.Contains(err.Error(), "not known") {
		t.Fatalf("drain of an unknown node: %v", err)
	}
	if out, err = run(nodeCmd(), "ls"); err != nil || !strings.Contains(out, "10.0.0.2:3001") {
		t.Fatalf("node ls: %q %v", out, err)
	}
	out, err = run(sandboxCmd(), "ls", "--json")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]sandboxRow{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r sandboxRow
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		rows[r.Node] = r
	}
	if rows["node-a"].State != "running" || rows["node-b"].State != "unreachable" || !strings.Contains(rows["node-b"].Reason, "node node-b lost since") {
		t.Fatalf("sandbox ls --json: %+v", rows)
	}
	st, _ = store.Open(ctx, dir)
	defer st.Close()
	if n, _ := st.GetNode(ctx, "node-a"); n.Drain != store.DrainStop {
		t.Fatalf("drain recorded as %q", n.Drain)
	}
}
