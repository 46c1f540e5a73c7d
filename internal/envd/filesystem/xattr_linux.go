package filesystem

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// metadataPrefix namespaces the SDK's file metadata among a file's extended attributes.
const metadataPrefix = "user.e2b."

// ReadMetadata returns the user.e2b.* xattrs of path (not following symlinks), without the
// prefix, or nil when there are none or the filesystem has no xattrs.
func ReadMetadata(path string) map[string]string {
	names, err := listXattrs(path)
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, n := range names {
		key, ok := strings.CutPrefix(n, metadataPrefix)
		if !ok {
			continue
		}
		val, err := getXattr(path, n)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val)
	}
	return md
}

// ReplaceMetadata makes md the exact set of user.e2b.* xattrs of path: keys not in md are removed.
// An empty md on a filesystem without xattr support is not an error.
func ReplaceMetadata(path string, md map[string]string) error {
	names, err := listXattrs(path)
	if err != nil && !(len(md) == 0 && errors.Is(err, unix.ENOTSUP)) {
		if errors.Is(err, unix.ENOTSUP) {
			return errdefs.InvalidArgument("metadata is not supported by the filesystem of '%s'", path)
		}
		return fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	for _, n := range names {
		key, ok := strings.CutPrefix(n, metadataPrefix)
		if !ok {
			continue
		}
		if _, keep := md[key]; keep {
			continue
		}
		if err := unix.Lremovexattr(path, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove xattr %s of %s: %w", n, path, err)
		}
	}
	for k, v := range md {
		if err := unix.Lsetxattr(path, metadataPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return errdefs.InvalidArgument("metadata is not supported by the filesystem of '%s'", path)
			}
			return fmt.Errorf("set xattr %s of %s: %w", k, path, err)
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		return nil, err
	}
	buf := make([]byte, size)
	// The list can grow between the two calls; ERANGE then means retry with the new size.
	for range 3 {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*2)
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				names = append(names, string(b))
			}
		}
		return names, nil
	}
	return nil, unix.ERANGE
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for range 3 {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := unix.Lgetxattr(path, name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, size)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return nil, unix.ERANGE
}
