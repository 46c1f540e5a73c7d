package filesystem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	pb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
)

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// inotifyWatcher watches one directory, or a tree of them, with one inotify instance. Events are
// named relative to the root. Mapping follows fsnotify, which E2B's envd uses: create and
// moved-to are CREATE, modify is WRITE, delete is REMOVE, moved-from is RENAME, attrib is CHMOD.
type inotifyWatcher struct {
	f         *os.File
	root      string
	recursive bool
	events    chan rawEvent
	done      chan struct{}
	closeOnce sync.Once

	mu sync.Mutex
	// wds maps a watch descriptor to its directory relative to root ("" is root). +checklocks:mu
	wds map[int32]string
}

// newWatcher starts watching root (an existing directory).
func newWatcher(root string, recursive bool) (watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify init: %w", err)
	}
	// A non-blocking fd wrapped by os.NewFile is owned by the runtime poller: Read parks the
	// goroutine and Close wakes it, so the watcher can always be stopped.
	w := &inotifyWatcher{
		f:         os.NewFile(uintptr(fd), "inotify"),
		root:      root,
		recursive: recursive,
		events:    make(chan rawEvent, 256),
		done:      make(chan struct{}),
		wds:       map[int32]string{},
	}
	if _, err := w.addTree(""); err != nil {
		_ = w.f.Close()
		return nil, err
	}
	go w.readLoop()
	return w, nil
}

func (w *inotifyWatcher) Events() <-chan rawEvent { return w.events }

func (w *inotifyWatcher) Close() {
	w.closeOnce.Do(func() {
		close(w.done)
		_ = w.f.Close()
	})
}

// addTree watches dir (relative to root) and, when recursive, every directory below it. It
// returns the paths found below dir, so a directory created with content already in it (mkdir -p,
// a moved-in tree) still reports that content.
func (w *inotifyWatcher) addTree(dir string) ([]string, error) {
	var found []string
	abs := filepath.Join(w.root, dir)
	if !w.recursive {
		return nil, w.add(dir)
	}
	err := filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == abs {
				return err
			}
			return nil
		}
		rel, _ := filepath.Rel(w.root, p)
		if rel == "." {
			rel = ""
		}
		if p != abs {
			found = append(found, rel)
		}
		if d.IsDir() {
			if err := w.add(rel); err != nil && p == abs {
				return err
			}
		}
		return nil
	})
	return found, err
}

func (w *inotifyWatcher) add(rel string) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	mask := uint32(watchMask)
	if rel != "" {
		mask |= unix.IN_DONT_FOLLOW // below the root, symlinks are not followed
	}
	var wd int
	var addErr error
	if err := rc.Control(func(fd uintptr) {
		wd, addErr = unix.InotifyAddWatch(int(fd), filepath.Join(w.root, rel), mask)
	}); err != nil {
		return err
	}
	if addErr != nil {
		return fmt.Errorf("inotify watch %s: %w", filepath.Join(w.root, rel), addErr)
	}
	w.mu.Lock()
	w.wds[int32(wd)] = rel
	w.mu.Unlock()
	return nil
}

// forget drops the watches of dir and everything below it (a directory moved out of the tree
// keeps its inotify watch, which would otherwise report under a stale name).
func (w *inotifyWatcher) forget(dir string) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, rel := range w.wds {
		if rel == dir || strings.HasPrefix(rel, dir+"/") {
			_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(wd)) })
			delete(w.wds, wd)
		}
	}
}

func (w *inotifyWatcher) readLoop() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.Close()
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			name := strings.TrimRight(string(buf[start:min(start+nameLen, n)]), "\x00")
			off = start + nameLen
			if !w.handle(wd, mask, name) {
				w.Close()
				return
			}
		}
	}
}

// handle turns one inotify event into zero or more events; false means the root is gone.
func (w *inotifyWatcher) handle(wd int32, mask uint32, name string) bool {
	w.mu.Lock()
	dir, ok := w.wds[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd)
	}
	w.mu.Unlock()
	if !ok {
		return true
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
		// Below the root the parent directory already reported the change.
		return dir != ""
	}
	rel := filepath.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		if !w.emit(rel, pb.EventType_EVENT_TYPE_CREATE) {
			return false
		}
		if isDir && w.recursive {
			found, _ := w.addTree(rel)
			for _, f := range found {
				if !w.emit(f, pb.EventType_EVENT_TYPE_CREATE) {
					return false
				}
			}
		}
	case mask&unix.IN_MODIFY != 0:
		return w.emit(rel, pb.EventType_EVENT_TYPE_WRITE)
	case mask&unix.IN_DELETE != 0:
		return w.emit(rel, pb.EventType_EVENT_TYPE_REMOVE)
	case mask&unix.IN_MOVED_FROM != 0:
		if isDir && w.recursive {
			w.forget(rel)
		}
		return w.emit(rel, pb.EventType_EVENT_TYPE_RENAME)
	case mask&unix.IN_ATTRIB != 0:
		return w.emit(rel, pb.EventType_EVENT_TYPE_CHMOD)
	}
	return true
}

func (w *inotifyWatcher) emit(rel string, t pb.EventType) bool {
	select {
	case w.events <- rawEvent{name: rel, typ: t}:
		return true
	case <-w.done:
		return false
	}
}

// Filesystem magic numbers (include/uapi/linux/magic.h) of network and FUSE filesystems, where
// inotify misses remote changes; watching them needs allow_network_mounts.
const (
	nfsSuperMagic  = 0x6969
	smbSuperMagic  = 0x517B
	cifsMagic      = 0xFF534D42
	smb2Magic      = 0xFE534D42
	fuseSuperMagic = 0x65735546
)

func isNetworkMount(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	switch uint32(st.Type) {
	case nfsSuperMagic, smbSuperMagic, cifsMagic, smb2Magic, fuseSuperMagic:
		return true, nil
	}
	return false, nil
}
