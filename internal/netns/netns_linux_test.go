package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func testName(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and must run as root (CI runs it as root)")
	}
	name := fmt.Sprintf("%stest-%d-%d", Prefix, os.Getpid(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _ = Delete(context.Background(), name) })
	return name
}

func loopbackFlags(t *testing.T, path string) net.Flags {
	t.Helper()
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	// Only loopback exists in a fresh namespace.
	links, err := h.LinkList()
	if err != nil || len(links) != 1 {
		t.Fatalf("links in new namespace = %d, %v; want only lo", len(links), err)
	}
	return lo.Attrs().Flags
}

func TestCreateDelete(t *testing.T) {
	ctx := context.Background()
	name := testName(t)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := vnetns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()

	path, err := Create(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if path != Path(name) {
		t.Fatalf("path = %s, want %s", path, Path(name))
	}
	after, err := vnetns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !before.Equal(after) {
		t.Fatal("Create left the calling thread in another network namespace")
	}
	if !isNamespace(path) {
		t.Fatalf("%s is not a mounted namespace", path)
	}
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Equal(before) {
		t.Fatal("the new namespace is the caller's namespace")
	}
	ns.Close()
	if f := loopbackFlags(t, path); f&net.FlagUp == 0 {
		t.Fatalf("loopback flags = %v, want up", f)
	}

	// Create again is recovery: same namespace, still up.
	if p, err := Create(ctx, name); err != nil || p != path {
		t.Fatalf("second Create = %q, %v", p, err)
	}
	names, err := List(ctx)
	if err != nil || !slices.Contains(names, name) {
		t.Fatalf("List = %v, %v; want it to contain %s", names, err, name)
	}

	if err := Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s left after Delete: %v", path, err)
	}
	if err := Delete(ctx, name); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	names, err = List(ctx)
	if err != nil || slices.Contains(names, name) {
		t.Fatalf("List after Delete = %v, %v", names, err)
	}
}

func TestCreateReplacesStaleFile(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	if err := ensureDir(); err != nil {
		t.Fatal(err)
	}
	// What a crash between creating the file and bind-mounting it leaves behind.
	if err := os.WriteFile(Path(name), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	path, err := Create(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !isNamespace(path) {
		t.Fatal("stale file was not replaced by a namespace")
	}
}

func TestInvalidNames(t *testing.T) {
	for _, n := range []string{"", ".", "..", "a/b", "x\x00"} {
		if _, err := Create(context.Background(), n); err == nil {
			t.Errorf("Create(%q) succeeded", n)
		}
		if err := Delete(context.Background(), n); err == nil {
			t.Errorf("Delete(%q) succeeded", n)
		}
	}
}
