//go:build !linux

package rootimage

import (
	"context"
	"errors"
)

func (s *Store) build(ctx context.Context, key string, lowers []string, envdDir string) (Image, error) {
	return Image{}, errors.New("root images are only built on Linux")
}

func removeBuild(dir string) error { return nil }
