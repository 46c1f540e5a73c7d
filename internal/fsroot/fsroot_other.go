//go:build !linux

package fsroot

import (
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Root is an open guest root directory. Outside Linux there is no RESOLVE_IN_ROOT, so no root
// can be opened and the methods below are never reached.
type Root struct{}

var errUnsupported = fmt.Errorf("guest root file operations are not supported on %s", runtime.GOOS)

// Open always fails outside Linux.
func Open(dir string) (*Root, error) { return nil, errUnsupported }

func (r *Root) Close() error                                   { return errUnsupported }
func (r *Root) Parent(p string) (*os.File, string, error)      { return nil, "", errUnsupported }
func (r *Root) Stat(p string) (unix.Stat_t, error)             { return unix.Stat_t{}, errUnsupported }
func (r *Root) Lstat(p string) (unix.Stat_t, error)            { return unix.Stat_t{}, errUnsupported }
func (r *Root) ReadFile(p string, limit int64) ([]byte, error) { return nil, errUnsupported }
func (r *Root) MkdirAll(p string, mode os.FileMode, uid, gid int) error {
	return errUnsupported
}
func (r *Root) WriteFile(p string, data []byte, mode os.FileMode, uid, gid int) error {
	return errUnsupported
}
func (r *Root) CreateFile(p string, mode os.FileMode, uid, gid int, fill func(io.Writer) error) error {
	return errUnsupported
}
func (r *Root) Symlink(target, p string, uid, gid int) error { return errUnsupported }
func (r *Root) Chown(p string, uid, gid int) error           { return errUnsupported }
func (r *Root) Chmod(p string, mode os.FileMode) error       { return errUnsupported }
