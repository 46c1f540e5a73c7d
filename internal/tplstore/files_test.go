package tplstore

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

// An archive uploaded through one driver is there for another sharing the store; a short upload
// leaves nothing; a template's removal takes its archives; nothing stays staged.
func TestFilesSharedThroughTheStore(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := NewFiles(store, dirA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewFiles(store, dirB)
	if err != nil {
		t.Fatal(err)
	}
	hash, other := strings.Repeat("a", 64), strings.Repeat("b", 64)
	data := bytes.Repeat([]byte("copy me "), 1<<17) // 1 MiB: several chunks

	if ok, err := b.Has(ctx, "tpl1", hash); err != nil || ok {
		t.Fatalf("Has before the upload = %v, %v", ok, err)
	}
	if _, err := b.Open(ctx, "tpl1", hash); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("Open before the upload = %v, want NotFound", err)
	}
	if err := a.Put(ctx, "tpl1", hash, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Has(ctx, "tpl1", hash); err != nil || !ok {
		t.Fatalf("Has on the other driver = %v, %v", ok, err)
	}
	f, err := b.Open(ctx, "tpl1", hash)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(data))
	}
	if ok, _ := b.Has(ctx, "tpl2", hash); ok {
		t.Fatal("an archive of one template is seen under another")
	}

	if err := a.Put(ctx, "tpl1", other, bytes.NewReader(data[:10]), int64(len(data))); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("a short upload = %v, want InvalidArgument", err)
	}
	if ok, _ := b.Has(ctx, "tpl1", other); ok {
		t.Fatal("a short upload was kept")
	}
	for _, bad := range []struct{ tpl, hash string }{{"tpl1", "abc"}, {"../x", hash}, {"", hash}, {"a/b", hash}} {
		if _, err := a.Has(ctx, bad.tpl, bad.hash); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("Has(%q, %q) = %v, want InvalidArgument", bad.tpl, bad.hash, err)
		}
	}

	if err := b.RemoveTemplate(ctx, "tpl1"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Has(ctx, "tpl1", hash); ok {
		t.Fatal("an archive outlived its template")
	}
	if err := b.RemoveTemplate(ctx, "../x"); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("RemoveTemplate(../x) = %v", err)
	}
	for _, dir := range []string{dirA, dirB} {
		left, _ := os.ReadDir(filepath.Join(dir, "build-files-stage"))
		if len(left) != 0 {
			t.Errorf("%s: %d entries left staged", dir, len(left))
		}
	}
}
