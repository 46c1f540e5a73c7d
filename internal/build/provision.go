package build

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/fsroot"
)

// DefaultUser is the account every template has and sandboxes run as unless told otherwise.
const DefaultUser = "user"

// provisionVersion changes whenever provision changes what it writes, so cached provisioned
// images are redone.
const provisionVersion = "provision/1"

// passwdEntry is one line of /etc/passwd.
type passwdEntry struct {
	name     string
	uid, gid int
	home     string
}

func readPasswd(root *fsroot.Root) ([]passwdEntry, error) {
	b, err := root.ReadFile("/etc/passwd", 4<<20)
	if err != nil {
		return nil, err
	}
	var out []passwdEntry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 || strings.HasPrefix(line, "#") {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	}
	return out, nil
}

func readGroups(root *fsroot.Root) map[string]int {
	out := map[string]int{}
	b, err := root.ReadFile("/etc/group", 4<<20)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 {
			continue
		}
		if gid, err := strconv.Atoi(f[2]); err == nil {
			out[f[0]] = gid
		}
	}
	return out
}

// lookupUser resolves "name", "uid", "name:group" or "uid:gid" against the image's account
// files. Root always resolves, even in images without /etc/passwd.
func lookupUser(root *fsroot.Root, spec string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	users, _ := readPasswd(root)
	uid, gid = -1, -1
	if n, err := strconv.Atoi(name); err == nil {
		uid, gid = n, n
		for _, u := range users {
			if u.uid == n {
				gid = u.gid
				break
			}
		}
	} else {
		for _, u := range users {
			if u.name == name {
				uid, gid = u.uid, u.gid
				break
			}
		}
		if uid < 0 && name == "root" {
			uid, gid = 0, 0
		}
		if uid < 0 {
			return 0, 0, errdefs.InvalidArgument("user %q does not exist in the template", name)
		}
	}
	if hasGroup {
		if n, err := strconv.Atoi(group); err == nil {
			gid = n
		} else if g, ok := readGroups(root)[group]; ok {
			gid = g
		} else {
			return 0, 0, errdefs.InvalidArgument("group %q does not exist in the template", group)
		}
	}
	return uid, gid, nil
}

// provision makes an image fit to be a sandbox, the way E2B's build provisions images: the
// default user with a home and passwordless sudo, /tmp, and the name-service files a runtime
// would otherwise bind-mount. Nothing the image already has is changed.
func provision(root *fsroot.Root, log func(format string, args ...any)) error {
	users, err := readPasswd(root)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read /etc/passwd: %w", err)
	}
	if err := root.MkdirAll("/etc", 0o755, 0, 0); err != nil {
		return err
	}
	shell := "/bin/sh"
	if _, err := root.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	var passwd, group []byte
	if b, err := root.ReadFile("/etc/passwd", 4<<20); err == nil {
		passwd = b
	}
	if b, err := root.ReadFile("/etc/group", 4<<20); err == nil {
		group = b
	}
	hasRoot, user := false, (*passwdEntry)(nil)
	usedUIDs := map[int]bool{}
	for i, u := range users {
		usedUIDs[u.uid] = true
		if u.name == "root" {
			hasRoot = true
		}
		if u.name == DefaultUser {
			user = &users[i]
		}
	}
	groups := readGroups(root)
	if !hasRoot {
		passwd = appendLine(passwd, "root:x:0:0:root:/root:"+shell)
	}
	if _, ok := groups["root"]; !ok {
		group = appendLine(group, "root:x:0:")
	}
	if user == nil {
		id := 1000
		for usedUIDs[id] || gidUsed(groups, id) {
			id++
		}
		user = &passwdEntry{name: DefaultUser, uid: id, gid: id, home: "/home/" + DefaultUser}
		passwd = appendLine(passwd, fmt.Sprintf("%s:x:%d:%d::%s:%s", DefaultUser, id, id, user.home, shell))
		if _, ok := groups[DefaultUser]; !ok {
			group = appendLine(group, fmt.Sprintf("%s:x:%d:", DefaultUser, id))
		}
		log("added user %s (uid %d)", DefaultUser, id)
	}
	if err := root.WriteFile("/etc/passwd", passwd, 0o644, 0, 0); err != nil {
		return err
	}
	if err := root.WriteFile("/etc/group", group, 0o644, 0, 0); err != nil {
		return err
	}
	if shadow, err := root.ReadFile("/etc/shadow", 4<<20); err == nil && !hasLine(shadow, DefaultUser+":") {
		if err := root.WriteFile("/etc/shadow", appendLine(shadow, DefaultUser+":*:19000:0:99999:7:::"), 0o640, 0, shadowGID(groups)); err != nil {
			return err
		}
	}
	if user.home != "" {
		if _, err := root.Stat(user.home); err != nil {
			if err := root.MkdirAll(user.home, 0o755, user.uid, user.gid); err != nil {
				return err
			}
			if err := root.Chown(user.home, user.uid, user.gid); err != nil {
				return err
			}
		}
	}
	if _, err := root.Stat("/etc/sudoers"); err == nil {
		if err := root.MkdirAll("/etc/sudoers.d", 0o750, 0, 0); err != nil {
			return err
		}
		if err := root.WriteFile("/etc/sudoers.d/90-vmon-user", []byte(DefaultUser+" ALL=(ALL:ALL) NOPASSWD: ALL\n"), 0o440, 0, 0); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"/tmp", 0o777 | os.ModeSticky}, {"/root", 0o700}, {"/proc", 0o555}, {"/sys", 0o555}, {"/dev", 0o755}} {
		if _, err := root.Stat(d.path); err != nil {
			if err := root.MkdirAll(d.path, d.mode, 0, 0); err != nil {
				return err
			}
			if err := root.Chmod(d.path, d.mode); err != nil {
				return err
			}
		}
	}
	// Images leave these to the runtime (Docker bind-mounts them); a sandbox needs its own. A
	// dangling symlink (systemd-resolved's stub) counts as missing.
	if _, err := root.Stat("/etc/resolv.conf"); err != nil {
		if err := root.WriteFile("/etc/resolv.conf", []byte("nameserver 8.8.8.8\nnameserver 8.8.4.4\n"), 0o644, 0, 0); err != nil {
			return err
		}
	}
	if _, err := root.Stat("/etc/hosts"); err != nil {
		if err := root.WriteFile("/etc/hosts", []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tvmon\n"), 0o644, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

func appendLine(b []byte, line string) []byte {
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	return append(b, line+"\n"...)
}

func hasLine(b []byte, prefix string) bool {
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

func gidUsed(groups map[string]int, id int) bool {
	for _, g := range groups {
		if g == id {
			return true
		}
	}
	return false
}

func shadowGID(groups map[string]int) int {
	if g, ok := groups["shadow"]; ok {
		return g
	}
	return 0
}
