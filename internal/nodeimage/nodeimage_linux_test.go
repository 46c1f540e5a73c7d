package nodeimage

import (
	"archive/tar"
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// makeTree writes the same tree in the given order of files, with build-time mtimes after the
// epoch and one file "from a package", older than it.
func makeTree(t *testing.T, order []string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/bin", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range order {
		if err := os.WriteFile(filepath.Join(root, name), []byte("content of "+name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "usr/bin/perl"), filepath.Join(root, "usr/bin/perl5")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("perl", filepath.Join(root, "usr/bin/link")); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2023, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(root, "etc/shipped"), old, old); err != nil {
		t.Fatal(err)
	}
	// Left out: the contents of an Empty directory, and sockets.
	if err := os.WriteFile(filepath.Join(root, "dev/null-ish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(root, "tmp/sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return root
}

func treeTar(t *testing.T, root string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteTree(&b, root, TreeOptions{Epoch: epoch, Empty: []string{"dev"}}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestWriteTreeReproducible(t *testing.T) {
	files := []string{"etc/shipped", "etc/hostname-ish", "usr/bin/perl", "usr/bin/zz"}
	a := treeTar(t, makeTree(t, files))
	rev := slices.Clone(files)
	slices.Reverse(rev)
	time.Sleep(1100 * time.Millisecond) // other mtimes, all after the epoch
	b := treeTar(t, makeTree(t, rev))
	if !bytes.Equal(a, b) {
		t.Fatal("two trees with the same contents gave different layers")
	}

	tr := tar.NewReader(bytes.NewReader(a))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		switch h.Name {
		case "etc/shipped":
			if !h.ModTime.Equal(time.Date(2023, 5, 1, 12, 0, 0, 0, time.UTC)) {
				t.Errorf("%s: mtime %v, want the package's own (older than the epoch)", h.Name, h.ModTime)
			}
		case "usr/bin/perl5":
			if h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/perl" {
				t.Errorf("%s: type %c link %q, want a hard link to usr/bin/perl", h.Name, h.Typeflag, h.Linkname)
			}
		case "usr/bin/link":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "perl" {
				t.Errorf("%s: type %c link %q", h.Name, h.Typeflag, h.Linkname)
			}
		default:
			if !h.ModTime.Equal(epoch) {
				t.Errorf("%s: mtime %v, want clamped to %v", h.Name, h.ModTime, epoch)
			}
		}
		if h.Uname != "" || h.Gname != "" || !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: names or times beyond the mtime: %+v", h.Name, h)
		}
	}
	want := []string{"dev/", "etc/", "etc/hostname-ish", "etc/shipped", "tmp/", "usr/", "usr/bin/",
		"usr/bin/link", "usr/bin/perl", "usr/bin/perl5", "usr/bin/zz"}
	if !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q", names, want)
	}
}

func TestAssembleReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmon")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho vmon\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	root := makeTree(t, []string{"etc/shipped", "usr/bin/perl"})
	build := func(n string) string {
		work := filepath.Join(dir, n)
		if err := os.Mkdir(work, 0o755); err != nil {
			t.Fatal(err)
		}
		base, top := filepath.Join(work, "base.tar"), filepath.Join(work, "top.tar")
		for path, write := range map[string]func(io.Writer) error{
			base: func(w io.Writer) error { return WriteTree(w, root, TreeOptions{Epoch: epoch, Empty: []string{"dev"}}) },
			top: func(w io.Writer) error {
				return WriteFiles(w, []File{{Path: "/usr/local/bin/vmon", Source: bin, Mode: 0o755}}, epoch.Add(time.Hour))
			},
		} {
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := write(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		img, err := Assemble([]Layer{{Tar: base, CreatedBy: "base"}, {Tar: top, CreatedBy: "vmon"}}, Config{
			Created: epoch.Add(time.Hour), Entrypoint: []string{"vmon"}, Cmd: []string{"serve"},
			Labels: map[string]string{"a": "1", "b": "2"}, Volumes: []string{"/var/lib/vmon"},
		})
		if err != nil {
			t.Fatal(err)
		}
		d, err := WriteLayout(filepath.Join(work, "image"), img, "test")
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.Entrypoint[0] != "vmon" || cf.Created.Unix() != epoch.Add(time.Hour).Unix() || len(cf.RootFS.DiffIDs) != 2 {
			t.Errorf("config %+v", cf)
		}
		return d.String()
	}
	a, b := build("one"), build("two")
	if a != b {
		t.Fatalf("two assemblies, two digests: %s, %s", a, b)
	}
}
