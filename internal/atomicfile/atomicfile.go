// Package atomicfile replaces small files whole: a reader, or the next start after a crash, sees
// the old content or the new, never a part. It writes only the file it is given and a temporary
// sibling of it.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Replace writes data to path through a temporary file renamed over it. Without a sync the new
// content may be lost in a power cut (the old one then stays): for state a restart can rebuild.
func Replace(path string, data []byte, perm os.FileMode) error {
	return replace(path, data, perm, false)
}

// ReplaceDurably is Replace with the file synced before the rename, for state nothing else can
// rebuild (credentials, claims of identity).
func ReplaceDurably(path string, data []byte, perm os.FileMode) error {
	return replace(path, data, perm, true)
}

func replace(path string, data []byte, perm os.FileMode, durable bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
