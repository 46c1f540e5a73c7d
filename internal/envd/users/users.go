// Package users owns envd's view of the guest's accounts: it reads /etc/passwd and /etc/group
// directly (no cgo, no NSS), so it works in envd's static binary, and it resolves client-supplied
// paths the way E2B's envd does for a given user. It never changes the account database.
package users

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// User is one account of the guest, as a process launched for it needs it.
type User struct {
	Name string
	UID  uint32
	GID  uint32
	// Groups holds the primary group followed by every supplementary group that lists the user.
	Groups []uint32
	Home   string
	Shell  string
}

// DB reads the account files. The zero value reads /etc/passwd and /etc/group; tests point it at
// fixtures. The files are re-read on every lookup so that accounts added at run time (useradd in a
// template build) are seen without a restart; they are small.
type DB struct {
	PasswdFile string
	GroupFile  string
}

func (d DB) passwdFile() string {
	if d.PasswdFile != "" {
		return d.PasswdFile
	}
	return "/etc/passwd"
}

func (d DB) groupFile() string {
	if d.GroupFile != "" {
		return d.GroupFile
	}
	return "/etc/group"
}

// Lookup returns the user called name; an unknown name is a NotFound error.
func (d DB) Lookup(name string) (*User, error) {
	if name == "" {
		return nil, errdefs.InvalidArgument("empty username")
	}
	var u *User
	err := readColonFile(d.passwdFile(), func(f []string) bool {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		u = &User{Name: name, UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("read passwd: %w", err)
	}
	if u == nil {
		return nil, errdefs.NotFound("user %q not found", name)
	}
	u.Groups = []uint32{u.GID}
	err = readColonFile(d.groupFile(), func(f []string) bool {
		// name:password:gid:member,member
		if len(f) < 4 || f[3] == "" {
			return true
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == u.GID {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if strings.TrimSpace(m) == name {
				u.Groups = append(u.Groups, uint32(gid))
				break
			}
		}
		return true
	})
	// A missing /etc/group only loses supplementary groups; the user can still run.
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read group: %w", err)
	}
	return u, nil
}

// Names maps numeric ids to account names, for reporting file owners.
type Names struct {
	users  map[uint32]string
	groups map[uint32]string
}

// Names loads a snapshot of both id→name maps; a listing of many files uses one snapshot.
func (d DB) Names() Names {
	n := Names{users: map[uint32]string{}, groups: map[uint32]string{}}
	load := func(path string, m map[uint32]string) {
		_ = readColonFile(path, func(f []string) bool {
			if len(f) < 3 {
				return true
			}
			if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				if _, dup := m[uint32(id)]; !dup {
					m[uint32(id)] = f[0]
				}
			}
			return true
		})
	}
	load(d.passwdFile(), n.users)
	load(d.groupFile(), n.groups)
	return n
}

// User returns the name of uid, or the number as text when no account has it.
func (n Names) User(uid uint32) string {
	if s, ok := n.users[uid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// Group returns the name of gid, or the number as text when no group has it.
func (n Names) Group(gid uint32) string {
	if s, ok := n.groups[gid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// readColonFile calls fn with the fields of each non-comment line until fn returns false.
func readColonFile(path string, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	return sc.Err()
}

// Resolve turns a client path into an absolute, clean path as user u sees it: "~" and "~/…" expand
// to the home directory, relative paths resolve against the home directory, and an empty path
// becomes emptyDefault (when set) or the home directory.
func (u *User) Resolve(p, emptyDefault string) (string, error) {
	home := u.Home
	if home == "" {
		home = "/"
	}
	switch {
	case p == "":
		if emptyDefault != "" {
			return u.Resolve(emptyDefault, "")
		}
		return filepath.Clean(home), nil
	case p == "~":
		return filepath.Clean(home), nil
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(home, p[2:]), nil
	case strings.HasPrefix(p, "~"):
		// ~otheruser is not supported by envd either; reject it rather than guess.
		return "", errdefs.InvalidArgument("path %q: ~user expansion is not supported", p)
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	default:
		return filepath.Join(home, p), nil
	}
}
