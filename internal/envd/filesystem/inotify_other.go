//go:build !linux

package filesystem

import "github.com/vibemon/vmon/internal/errdefs"

func newWatcher(string, bool) (watcher, error) {
	return nil, errdefs.Unavailable("watching directories is only supported on linux")
}

func isNetworkMount(string) (bool, error) { return false, nil }
