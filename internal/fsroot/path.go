package fsroot

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// ErrUnsafePath marks a name that climbs above the root (see CleanStrict).
var ErrUnsafePath = errors.New("path escapes the image root")

// ErrDangling marks a path that runs into a symlink whose target does not exist, where
// MkdirAllFD would have to create that target.
var ErrDangling = errors.New("path passes through a dangling symlink")

// Clean makes p a path relative to the root ("." for the root itself). It clamps: ".." cannot
// climb above the root, just as it cannot inside the guest, so "../../etc" is "etc".
func Clean(p string) string {
	c := path.Clean("/" + p)
	if c == "/" {
		return "."
	}
	return c[1:]
}

// CleanStrict is Clean for untrusted names such as tar entries: a name whose ".." elements
// climb above the root is rejected with ErrUnsafePath rather than clamped, since no legitimate
// archive has one. ".." that stays inside ("a/../b") is resolved lexically, as Clean does.
func CleanStrict(name string) (string, error) {
	depth := 0
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
			}
		default:
			depth++
		}
	}
	return Clean(name), nil
}

// SplitParent splits a clean root-relative path into its parent ("." at the top) and its last
// element.
func SplitParent(rel string) (parent, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}
