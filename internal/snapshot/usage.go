package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Usage adds up the disk a directory of snapshots takes (Bytes of each), remembering the figure
// of every published snapshot: with hundreds of sandboxes paused, walking every file of every
// snapshot at every pause (the node checks its snapshot budget first) made a pause slower the
// more were paused.
//
// A published snapshot is a directory whose name is not hidden (in-progress and discarded ones
// carry tmpPrefix or spentPrefix and are walked every time). Its figure is kept while the
// directory's inode and modification time stay the same: publishing, resealing and discarding
// all change those. What can change below it without touching them is a resume moving the
// writable layer out and, if the resume fails, back; until the snapshot is discarded it is
// counted whole, which errs on the side of the budget.
type Usage struct {
	mu sync.Mutex
	// +checklocks:mu
	dirs map[string]usageEntry
}

type usageEntry struct {
	ino, mtime int64
	bytes      int64
}

// Bytes is the disk space everything under root takes, as snapshot.Bytes(root) would say.
func (u *Usage) Bytes(root string) int64 {
	ents, err := os.ReadDir(root)
	if err != nil {
		return 0
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.dirs == nil {
		u.dirs = map[string]usageEntry{}
	}
	seen := make(map[string]bool, len(ents))
	var total int64
	for _, e := range ents {
		p := filepath.Join(root, e.Name())
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			total += Bytes(p)
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			continue // gone meanwhile
		}
		seen[e.Name()] = true
		c, ok := u.dirs[e.Name()]
		if !ok || c.ino != int64(st.Ino) || c.mtime != st.Mtim.Nano() {
			c = usageEntry{ino: int64(st.Ino), mtime: st.Mtim.Nano(), bytes: Bytes(p)}
			u.dirs[e.Name()] = c
		}
		total += c.bytes
	}
	for name := range u.dirs {
		if !seen[name] {
			delete(u.dirs, name)
		}
	}
	return total
}
