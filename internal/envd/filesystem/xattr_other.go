//go:build !linux

package filesystem

import "github.com/vibemon/vmon/internal/errdefs"

// ReadMetadata returns nil: file metadata lives in Linux user xattrs.
func ReadMetadata(string) map[string]string { return nil }

// ReplaceMetadata supports only the empty set outside Linux.
func ReplaceMetadata(_ string, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	return errdefs.Unavailable("file metadata is only supported on linux")
}
