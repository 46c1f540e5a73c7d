package firewall

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// fakeRunner records scripts and answers saves with a canned table.
type fakeRunner struct {
	mu      sync.Mutex
	scripts []string
	saved   string
	fail    func(script string) error
}

func (r *fakeRunner) restore(_ context.Context, f family, s string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scripts = append(r.scripts, f.String()+"\n"+s)
	if r.fail != nil {
		return r.fail(s)
	}
	return nil
}

func (r *fakeRunner) save(context.Context, family) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.saved, nil
}

func (r *fakeRunner) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scripts
	r.scripts = nil
	slices.Sort(s) // the two families run concurrently
	return s
}

func newFake(t *testing.T) (*Firewall, *fakeRunner) {
	r := &fakeRunner{}
	fw := newFirewall(testNames(t), defaultEnv, r, slog.New(slog.DiscardHandler))
	t.Cleanup(fw.Close)
	return fw, r
}

func TestHooksLifecycle(t *testing.T) {
	ctx := context.Background()
	fw, r := newFake(t)
	h, err := fw.Install(ctx, link7)
	if err != nil {
		t.Fatal(err)
	}
	// The node-wide rules, then the link's, per family.
	if s := r.take(); len(s) != 4 || !strings.Contains(strings.Join(s, ""), "-A VMON-E7 -j DROP") {
		t.Fatalf("install scripts = %q", s)
	}
	if _, err := fw.Install(ctx, Link{Index: 8, Guest: link7.Guest.Next().Next().Next().Next(), Pool: link7.Pool}); err != nil {
		t.Fatal(err)
	}
	if s := r.take(); len(s) != 2 {
		t.Fatalf("second install wrote the node-wide rules again: %q", s)
	}

	// Attach on a closed chain: add-only, nothing to compact.
	if err := h.Attach(ctx, egress.Policy{DenyOut: pfx("0.0.0.0/0", "::/0")}); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.take() {
		if strings.Contains(s, "-F ") || strings.Contains(s, "-D ") {
			t.Errorf("attach deletes rules:\n%s", s)
		}
	}
	fw.wg.Wait()
	if s := r.take(); len(s) != 0 {
		t.Errorf("attach on a closed chain queued a compaction: %q", s)
	}

	// Update: add-only on the request path, then one compaction per family.
	if err := h.Update(ctx, egress.Policy{AllowOut: pfx("203.0.113.0/24"), DenyOut: pfx("0.0.0.0/0", "::/0")}); err != nil {
		t.Fatal(err)
	}
	fw.wg.Wait()
	s := r.take()
	// Per family the update and the compaction, and for IPv4 the new policy's shared chain (in
	// IPv6 the policy renders as before, so its chain exists).
	if len(s) != 5 {
		t.Fatalf("update+compaction ran %d scripts, want 5: %q", len(s), s)
	}
	var created bool
	for _, sc := range s {
		created = created || (strings.HasPrefix(sc, "ipv4") && strings.Contains(sc, "-d 203.0.113.0/24 -j ACCEPT") && strings.Contains(sc, ":VMON-POL-"))
	}
	if !created {
		t.Errorf("the policy's shared chain was not created: %q", s)
	}
	var compactions int
	for _, sc := range s {
		if strings.Contains(sc, "-F VMON-E7") {
			compactions++
			if !strings.HasSuffix(sc, "-A VMON-E7 -j DROP\nCOMMIT\n") {
				t.Errorf("compaction does not end closed:\n%s", sc)
			}
			if !strings.Contains(sc, "-A VMON-E7 -j VMON-POL-") {
				t.Errorf("compaction lost the live block:\n%s", sc)
			}
		}
	}
	if compactions != 2 {
		t.Errorf("compactions = %d, want 2", compactions)
	}

	if err := h.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sc := range r.take() {
		if !strings.HasSuffix(sc, "*filter\n-F VMON-E7\n-A VMON-E7 -j DROP\nCOMMIT\n") {
			t.Errorf("detach script:\n%s", sc)
		}
	}
	if err := h.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Attach(ctx, egress.Policy{}); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("attach after remove: %v", err)
	}
}

func TestUnrestrictedHasNoHooks(t *testing.T) {
	fw, r := newFake(t)
	l := link7
	l.Unrestricted = true
	h, err := fw.Install(context.Background(), l)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.take() {
		if strings.Contains(s, "VMON-E7") || strings.Contains(s, "VMON-T7") {
			t.Errorf("template link got egress hooks:\n%s", s)
		}
	}
	if err := h.Attach(context.Background(), egress.Policy{}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Errorf("attach on a template link: %v", err)
	}
}

func TestInstallRollsBack(t *testing.T) {
	fw, r := newFake(t)
	r.saved = savedSample
	r.fail = func(s string) error {
		if strings.Contains(s, "-I FORWARD 1 -i vmon7") {
			return errors.New("boom")
		}
		return nil
	}
	if _, err := fw.Install(context.Background(), link7); err == nil {
		t.Fatal("install succeeded")
	}
	var removal bool
	for _, s := range r.take() {
		removal = removal || strings.Contains(s, "-X VMON-F7")
	}
	if !removal {
		t.Error("failed install was not rolled back")
	}
}

func TestFailedUpdateIsRepairedByDetach(t *testing.T) {
	ctx := context.Background()
	fw, r := newFake(t)
	h, _ := fw.Install(ctx, link7)
	r.fail = func(string) error { return errors.New("boom") }
	if err := h.Update(ctx, egress.Policy{}); err == nil {
		t.Fatal("update succeeded")
	}
	r.fail = nil
	r.take()
	if err := h.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if s := r.take(); len(s) != 2 || !strings.Contains(s[0], "-F VMON-E7") {
		t.Errorf("detach after a failed update = %q", s)
	}
}

// savedSample is iptables-save output with links 7 and 9 of this node, a link of a node with
// another prefix, and rules of other software, some of them mentioning our names.
const savedSample = `# Generated by iptables-save v1.8.9 (nf_tables)
*mangle
:PREROUTING ACCEPT [0:0]
-A PREROUTING -i vmon7 -m comment --comment vmon-egress -j CONNMARK --set-xmark 0x8/0xffffffff
-A PREROUTING -i vmon9 -m comment --comment vmon-egress -j CONNMARK --set-xmark 0xa/0xffffffff
-A PREROUTING -i vmon7 -j MARK --set-xmark 0x1/0xffffffff
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:DOCKER-USER - [0:0]
:VMON-E7 - [0:0]
:VMON-F7 - [0:0]
:VMON-R7 - [0:0]
:VMON-E9 - [0:0]
:OTHER-E7 - [0:0]
-A INPUT -i vmon7 -m comment --comment vmon-egress -j VMON-R7
-A FORWARD -i vmon7 -m comment --comment vmon-egress -j VMON-F7
-A FORWARD -o vmon7 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment vmon-egress -j ACCEPT
-A FORWARD -o vmon7 ! -i vmon+ -m comment --comment "vmon-egress" -j DROP
-A FORWARD -i other7 -m comment --comment vmon-egress -j OTHER-E7
-A FORWARD -j DOCKER-USER
-A FORWARD -i vmon7 -m comment --comment "not ours" -j ACCEPT
-A VMON-E7 -j DROP
-A VMON-F7 ! -s 172.20.0.30/32 -j DROP
-A VMON-F7 -j VMON-E7
-A VMON-R7 -p tcp -j REJECT --reject-with tcp-reset
-A VMON-E9 -j DROP
-A OTHER-E7 -j DROP
COMMIT
*nat
:POSTROUTING ACCEPT [0:0]
:VMON-M7 - [0:0]
-A POSTROUTING -s 172.20.0.30/32 ! -d 172.20.0.0/16 -m comment --comment vmon-egress -j VMON-M7
-A VMON-M7 -j MASQUERADE
COMMIT
`

func TestRenderRemove(t *testing.T) {
	n := testNames(t)
	s, removed := renderRemove(n, parseSave(savedSample), func(i int) bool { return i == 7 })
	want := `*mangle
-D PREROUTING -i vmon7 -m comment --comment vmon-egress -j CONNMARK --set-xmark 0x8/0xffffffff
COMMIT
*filter
-D INPUT -i vmon7 -m comment --comment vmon-egress -j VMON-R7
-D FORWARD -i vmon7 -m comment --comment vmon-egress -j VMON-F7
-D FORWARD -o vmon7 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment vmon-egress -j ACCEPT
-D FORWARD -o vmon7 ! -i vmon+ -m comment --comment "vmon-egress" -j DROP
-F VMON-E7
-F VMON-F7
-F VMON-R7
-X VMON-E7
-X VMON-F7
-X VMON-R7
COMMIT
*nat
-D POSTROUTING -s 172.20.0.30/32 ! -d 172.20.0.0/16 -m comment --comment vmon-egress -j VMON-M7
-F VMON-M7
-X VMON-M7
COMMIT
`
	if s != want {
		t.Errorf("removal of link 7:\n%s\nwant:\n%s", s, want)
	}
	if !slices.Equal(removed, []int{7}) {
		t.Errorf("removed = %v", removed)
	}
	s, removed = renderRemove(n, parseSave(savedSample), func(int) bool { return true })
	if !slices.Equal(removed, []int{7, 9}) || !strings.Contains(s, "-X VMON-E9") || strings.Contains(s, "OTHER") ||
		strings.Contains(s, "not ours") || strings.Contains(s, "MARK --set-xmark 0x1") {
		t.Errorf("sweep of everything: removed %v\n%s", removed, s)
	}
	if s, removed := renderRemove(n, parseSave(savedSample), func(i int) bool { return i == 3 }); s != "" || removed != nil {
		t.Errorf("removal of an absent link = %q, %v", s, removed)
	}
}

func TestSplitArgs(t *testing.T) {
	got := splitArgs(`-A FORWARD -m comment --comment "a \"b\" c" -j ACCEPT`)
	want := []string{"-A", "FORWARD", "-m", "comment", "--comment", `a "b" c`, "-j", "ACCEPT"}
	if !slices.Equal(got, want) {
		t.Errorf("splitArgs = %q", got)
	}
}

// The node-wide DENIED chain: created when missing, rewritten in place (never deleted and
// re-created, which would fail while attached links jump to it) when a node restarts, and
// removed with the node-wide rules only once no link chain is left to jump to it.
func TestDeniedChainLifecycle(t *testing.T) {
	ctx := context.Background()
	fw, r := newFake(t)
	if err := fw.EnsureGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.take() {
		if !strings.Contains(s, ":VMON-DENIED - [0:0]\n") || strings.Contains(s, "-F VMON-DENIED") {
			t.Errorf("first EnsureGlobal:\n%s", s)
		}
	}

	// A restart finds the chain (and a link still jumping to it).
	r.saved = "*filter\n:FORWARD ACCEPT [0:0]\n:VMON-DENIED - [0:0]\n:VMON-E7 - [0:0]\n:VMON-F7 - [0:0]\n" +
		"-A VMON-DENIED -d 10.0.0.0/8 -j REJECT --reject-with icmp-admin-prohibited\n-A VMON-E7 -j VMON-DENIED\nCOMMIT\n"
	restarted := newFirewall(testNames(t), egress.NewEnv(pfx("10.20.0.0/16")), r, slog.New(slog.DiscardHandler))
	t.Cleanup(restarted.Close)
	if err := restarted.EnsureGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.take() {
		if strings.Contains(s, ":VMON-DENIED") || !strings.Contains(s, "-F VMON-DENIED\n") {
			t.Errorf("EnsureGlobal over an existing chain must flush it in place:\n%s", s)
		}
		if strings.HasPrefix(s, "ipv4") && (!strings.Contains(s, "-A VMON-DENIED -d 10.21.0.0/16 ") || strings.Contains(s, "-d 10.0.0.0/8 ")) {
			t.Errorf("the rewritten chain does not follow the new exemption:\n%s", s)
		}
	}

	// Links left: the global rules may go, the chain they jump to stays.
	if err := restarted.RemoveGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.take() {
		if strings.Contains(s, "VMON-DENIED") {
			t.Errorf("RemoveGlobal touched the chain while link chains exist:\n%s", s)
		}
	}
	r.saved = "*filter\n:FORWARD ACCEPT [0:0]\n:VMON-DENIED - [0:0]\nCOMMIT\n"
	if err := restarted.RemoveGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	if s := r.take(); len(s) != 2 || !strings.Contains(s[0], "-F VMON-DENIED\n-X VMON-DENIED\n") {
		t.Errorf("RemoveGlobal with no link left:\n%q", s)
	}
}
