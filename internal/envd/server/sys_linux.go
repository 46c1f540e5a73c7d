package server

import (
	"time"

	"golang.org/x/sys/unix"
)

// setClock sets the guest's wall clock (a restored snapshot wakes up with a stale one).
func setClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

func diskUsage(path string) (used, total uint64) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0
	}
	bs := uint64(st.Bsize)
	return (st.Blocks - st.Bfree) * bs, st.Blocks * bs
}
