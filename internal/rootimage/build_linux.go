package rootimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
	// The merged root's own mtime is the overlay's upper directory's (made just now), so the
	// image's root takes the topmost layer's.
	var top unix.Stat_t
	if err := unix.Stat(lowers[0], &top); err != nil {
		return Image{}, fmt.Errorf("stat the template's top layer: %w", err)
	}
	if err := addGuestFiles(merged, envdDir, s.opts.GuestBinDir, top.Mtim); err != nil {
		return Image{}, err
	}
	img := Image{Lowers: lowers, Envd: envdDir, BuiltAt: time.Now().UTC(), Bash: fsroot.Exists(merged, "bin/bash")}
	tmpImage := filepath.Join(work, "image.erofs")
	// gVisor reads no tail-packed (inline) file data, hence noinline_data. The UUID and the build
	// time (SOURCE_DATE_EPOCH, which also leaves every file's own mtime alone) are fixed, so the
	// same template and envd build give the same bytes on every node, whatever order its
	// filesystem lists directories in and wherever it keeps the layers (a node that built a
	// template names its layers by build step, one that fetched it by content): a checkpoint
	// taken on one node's image restores on another's.
	cmd := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", "-E", "noinline_data", "-U", imageUUID, tmpImage, merged)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(buildEpoch, 10))
	if out, err := cmd.CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return Image{}, fmt.Errorf("mkfs.erofs is missing (apt-get install erofs-utils): %w", err)
		}
		return Image{}, fmt.Errorf("mkfs.erofs: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if img.Digest, err = syncAndDigest(tmpImage); err != nil {
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

// buildEpoch is every image's build time: 2100-01-01, later than any file's own mtime (mkfs.erofs
// would clamp a later one to it), so that no file's time changes.
const buildEpoch = 4102444800

// imageUUID is every image's filesystem UUID: nothing mounts two of them on one host (gVisor
// reads each through its own descriptor), and one derived from the key would make images of the
// same files differ between nodes whose layers have other paths.
const imageUUID = "766d6f6e-726f-6f74-2d69-6d6167650003"

// addGuestFiles copies envd's build directory to guestBin in the merged root, root-owned and
// read-only, and creates keepFile. The root and what it adds take rootTime, and the directories
// it adds to keep theirs: the build's own time would make every node's image differ.
func addGuestFiles(merged, envdDir, guestBin string, rootTime unix.Timespec) error {
	r, err := fsroot.Open(merged)
	if err != nil {
		return err
	}
	defer r.Close()
	times := keepTimes(r, rootTime, guestBin, filepath.Dir(keepFile))
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
	added := []string{keepFile}
	for _, e := range ents {
		if e.Type().IsRegular() {
			added = append(added, filepath.Join(guestBin, e.Name()))
		}
	}
	if err := times.restore(r, added); err != nil {
		return fmt.Errorf("set the added files' times: %w", err)
	}
	return nil
}

// savedTimes are the mtimes of the directories on the way to what a build adds, taken before it
// adds anything, and the root's, which what is added takes.
type savedTimes struct {
	root    unix.Timespec
	dirs    []string // every directory on the way, deepest first
	existed map[string]unix.Timespec
}

func keepTimes(r *fsroot.Root, root unix.Timespec, dirs ...string) savedTimes {
	t := savedTimes{root: root, existed: map[string]unix.Timespec{}}
	seen := map[string]bool{}
	for _, d := range dirs {
		for d = fsroot.Clean(d); d != "" && d != "." && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			t.dirs = append(t.dirs, d)
			if st, err := r.Stat(d); err == nil {
				t.existed[d] = st.Mtim
			}
		}
	}
	slices.SortFunc(t.dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	t.dirs = append(t.dirs, "/")
	t.existed["/"] = t.root
	return t
}

// restore gives the added files and the directories created since keepTimes the root's mtime,
// and the directories that existed theirs back, deepest first (setting a time never changes the
// parent's).
func (t savedTimes) restore(r *fsroot.Root, added []string) error {
	for _, p := range added {
		if err := setMtime(r, p, t.root); err != nil {
			return err
		}
	}
	for _, d := range t.dirs {
		ts, ok := t.existed[d]
		if !ok {
			ts = t.root
		}
		if err := setMtime(r, d, ts); err != nil {
			return err
		}
	}
	return nil
}

// setMtime sets p's mtime and atime (resolved inside the root, as the guest would see it).
func setMtime(r *fsroot.Root, p string, ts unix.Timespec) error {
	fd, err := r.OpenFD(p, unix.O_PATH)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer unix.Close(fd)
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, fsroot.ProcPath(fd, ""), []unix.Timespec{ts, ts}, 0); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// syncAndDigest makes the image's data durable before it is renamed into place (a crash must
// never leave a record naming a half-written image) and returns its sha256.
func syncAndDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("digest the image: %w", err)
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// removeBuild unmounts a build's overlay and removes its directory.
func removeBuild(dir string) error {
	err := rootfs.Release(context.Background(), dir)
	return errors.Join(err, rootfs.RemoveTree(dir))
}
