package volumes

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

// newDir makes a Dir of small volumes in a temporary data dir and deletes every volume left at
// the end, so no mount or loop device outlives the test.
func newDir(t *testing.T) *Dir {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("volumes are loop-mounted filesystems: this test must run as root (CI runs it as root)")
	}
	data := t.TempDir()
	d, err := New(data, Options{DefaultSizeMB: MinSizeMB, MaxSizeMB: 1024, ImageDir: filepath.Join(data, "disk-images")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, _ := d.IDs()
		for _, id := range ids {
			if err := d.Delete(id); err != nil {
				t.Errorf("delete %s: %v", id, err)
			}
		}
	})
	return d
}

func TestContent(t *testing.T) {
	d := newDir(t)
	if err := d.Create(context.Background(), "v1", 0); err != nil {
		t.Fatal(err)
	}
	mode := uint32(0o600)
	e, err := d.Write("v1", "/a/b/c.txt", strings.NewReader("hello"), Attrs{Mode: &mode}, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != "file" || e.Size != 5 || e.Path != "/a/b/c.txt" || e.Mode != 0o600 {
		t.Fatalf("written entry = %+v", e)
	}
	if _, err := d.Write("v1", "/x/y.txt", strings.NewReader("x"), Attrs{}, false); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("write under a missing parent without force = %v", err)
	}
	f, size, err := d.Open("v1", "a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "hello" || size != 5 {
		t.Fatalf("read %q (%d)", b, size)
	}
	if _, err := d.Mkdir("v1", "/a", Attrs{}, false); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("mkdir of an existing dir = %v", err)
	}
	if _, err := d.Mkdir("v1", "/d/e", Attrs{}, true); err != nil {
		t.Fatal(err)
	}
	ents, err := d.List("v1", "/", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 || ents[0].Path != "/a" || ents[1].Path != "/d" {
		t.Fatalf("depth 1 = %+v", ents)
	}
	deep, err := d.List("v1", "/", 3)
	if err != nil || len(deep) != 5 {
		t.Fatalf("depth 3 = %+v, %v", deep, err)
	}
	// Nothing leaves the volume: not "..", not a symlink a guest planted.
	p, _ := d.Path("v1")
	if err := os.Symlink("/etc", filepath.Join(p, "escape")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Open("v1", "/escape/passwd"); err == nil {
		t.Fatal("read through a symlink out of the volume")
	}
	if _, err := d.Write("v1", "/escape/owned", strings.NewReader("x"), Attrs{}, false); err == nil {
		t.Fatal("wrote through a symlink out of the volume")
	}
	if _, err := d.Stat("v1", "/../../etc/passwd"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("stat of a path with .. = %v (it must stay inside: /etc/passwd of the volume)", err)
	}
	if e, err := d.Stat("v1", "/escape"); err != nil || e.Type != "symlink" || e.Target != "/etc" {
		t.Fatalf("stat of a symlink = %+v, %v", e, err)
	}
	// A FIFO is refused, never waited on.
	if err := syscall.Mkfifo(filepath.Join(p, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Open("v1", "/fifo"); err == nil {
		t.Fatal("opened a FIFO for download")
	}
	uid := uint32(1000)
	if e, err := d.Chattr("v1", "/a", Attrs{UID: &uid, GID: &uid}); err != nil || e.UID != 1000 {
		t.Fatalf("chattr = %+v, %v", e, err)
	}
	if err := d.Remove("v1", "/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Stat("v1", "/a/b/c.txt"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("stat after remove = %v", err)
	}
	if err := d.Remove("v1", "/"); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("remove of the root = %v", err)
	}
	if _, err := d.List("nosuch", "/", 1); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("list of a missing volume = %v", err)
	}
	if err := d.Delete("v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("volume dir left after Delete")
	}
}
