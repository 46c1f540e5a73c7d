package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Entry describes the file at path (not following a final symlink). A missing path is NotFound.
func Entry(path string, names users.Names) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("path '%s' does not exist", path)
		}
		return nil, errdefs.Wrap(errdefs.KindUnknown, err, "stat '%s'", path)
	}
	return entryFrom(path, fi, names), nil
}

// entryFrom renders fi, the lstat of path. For a symlink the type and mode are the target's (the
// SDK shows what the link leads to) and symlink_target is the absolute resolved target; a dangling
// link keeps type SYMLINK so the SDK still lists it.
func entryFrom(path string, fi fs.FileInfo, names users.Names) *pb.EntryInfo {
	mode := fi.Mode()
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Type:         fileType(mode),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(mode.Perm()),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Metadata:     ReadMetadata(path),
	}
	if path == "/" {
		e.Name = "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.User(st.Uid)
		e.Group = names.Group(st.Gid)
	}
	if mode&fs.ModeSymlink != 0 {
		if target, err := filepath.EvalSymlinks(path); err == nil {
			if abs, err := filepath.Abs(target); err == nil {
				target = abs
			}
			e.SymlinkTarget = &target
			if tfi, err := os.Stat(target); err == nil {
				e.Type = fileType(tfi.Mode())
				e.Mode = uint32(tfi.Mode().Perm())
			}
		} else if raw, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(raw) {
				raw = filepath.Join(filepath.Dir(path), raw)
			}
			e.SymlinkTarget = &raw
		}
	}
	return e
}

func fileType(m fs.FileMode) pb.FileType {
	switch {
	case m.IsRegular():
		return pb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	default:
		// Devices, sockets and FIFOs: the SDK drops UNSPECIFIED entries, as E2B's envd has them.
		return pb.FileType_FILE_TYPE_UNSPECIFIED
	}
}
