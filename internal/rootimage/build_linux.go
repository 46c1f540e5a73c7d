package rootimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/atomicfile"
	"github.com/vibemon/vmon/internal/fsroot"
	"github.com/vibemon/vmon/internal/rootfs"
)

// keepFile is put in the image's /tmp: gVisor mounts a tmpfs over an empty /tmp, which would
// keep the guest's /tmp in memory instead of on the sandbox's disk.
const keepFile = "tmp/.vmon-keep"

// build merges lowers in an overlay mounted under a working directory, adds envd and keepFile
// there (copied up, so every directory keeps the template's owner and mode), and makes the
// image with mkfs.erofs.
func (s *Store) build(ctx context.Context, key string, lowers []string, envdDir string) (Image, error) {
	work, err := os.MkdirTemp(s.opts.Dir, buildPrefix)
	if err != nil {
		return Image{}, err
	}
	defer func() { _ = removeBuild(work) }()
	merged, err := rootfs.Prepare(ctx, lowers, work, rootfs.Options{})
	if err != nil {
		return Image{}, fmt.Errorf("merge the template's layers: %w", err)
	}
	if err := addGuestFiles(merged, envdDir, s.opts.GuestBinDir); err != nil {
		return Image{}, err
	}
	img := Image{Lowers: lowers, Envd: envdDir, BuiltAt: time.Now().UTC(), Bash: fsroot.Exists(merged, "bin/bash")}
	tmpImage := filepath.Join(work, "image.erofs")
	// gVisor reads no tail-packed (inline) file data, hence noinline_data.
	cmd := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", "-E", "noinline_data", tmpImage, merged)
	if out, err := cmd.CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return Image{}, fmt.Errorf("mkfs.erofs is missing (apt-get install erofs-utils): %w", err)
		}
		return Image{}, fmt.Errorf("mkfs.erofs: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := syncFile(tmpImage); err != nil {
		return Image{}, err
	}
	if err := os.Rename(tmpImage, s.imagePath(key)); err != nil {
		return Image{}, err
	}
	rec, err := json.Marshal(img)
	if err == nil {
		err = atomicfile.ReplaceDurably(s.recordPath(key), rec, 0o600)
	}
	if err != nil {
		_ = os.Remove(s.imagePath(key))
		return Image{}, fmt.Errorf("record root image: %w", err)
	}
	img.Path = s.imagePath(key)
	return img, nil
}

// addGuestFiles copies envd's build directory to guestBin in the merged root, root-owned and
// read-only, and creates keepFile.
func addGuestFiles(merged, envdDir, guestBin string) error {
	r, err := fsroot.Open(merged)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.MkdirAll(guestBin, 0o755, 0, 0); err != nil {
		return fmt.Errorf("create %s in the image: %w", guestBin, err)
	}
	ents, err := os.ReadDir(envdDir)
	if err != nil {
		return fmt.Errorf("read envd build: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		src, err := os.Open(filepath.Join(envdDir, e.Name()))
		if err != nil {
			return err
		}
		fi, err := src.Stat()
		if err == nil {
			mode := fi.Mode().Perm() &^ 0o222
			err = r.CreateFile(filepath.Join(guestBin, e.Name()), mode, 0, 0, func(w io.Writer) error {
				_, err := io.Copy(w, src)
				return err
			})
		}
		src.Close()
		if err != nil {
			return fmt.Errorf("copy envd into the image: %w", err)
		}
	}
	if !fsroot.Exists(merged, "tmp") {
		if err := r.MkdirAll("tmp", os.ModeSticky|0o777, 0, 0); err != nil {
			return fmt.Errorf("create /tmp in the image: %w", err)
		}
	}
	if err := r.WriteFile(keepFile, nil, 0o444, 0, 0); err != nil {
		return fmt.Errorf("mark /tmp in the image: %w", err)
	}
	return nil
}

// syncFile makes the image's data durable before it is renamed into place: a crash must never
// leave a record naming a half-written image.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// removeBuild unmounts a build's overlay and removes its directory.
func removeBuild(dir string) error {
	err := rootfs.Release(context.Background(), dir)
	return errors.Join(err, rootfs.RemoveTree(dir))
}
