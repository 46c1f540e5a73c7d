package users

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

func fixture(t *testing.T) DB {
	t.Helper()
	dir := t.TempDir()
	passwd := "# comment\nroot:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n" +
		"svc:x:998:997::/:/usr/sbin/nologin\n"
	group := "root:x:0:\nsudo:x:27:user,other\nuser:x:1000:\ndocker:x:999: user \nsvc:x:997:\n"
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return DB{PasswdFile: filepath.Join(dir, "passwd"), GroupFile: filepath.Join(dir, "group")}
}

func TestLookup(t *testing.T) {
	db := fixture(t)
	u, err := db.Lookup("user")
	if err != nil {
		t.Fatal(err)
	}
	if u.UID != 1000 || u.GID != 1000 || u.Home != "/home/user" || u.Shell != "/bin/bash" {
		t.Fatalf("unexpected user %+v", u)
	}
	if want := []uint32{1000, 27, 999}; !slices.Equal(u.Groups, want) {
		t.Fatalf("groups = %v, want %v", u.Groups, want)
	}
	if _, err := db.Lookup("nobody-here"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("unknown user: got %v, want NotFound", err)
	}
	n := db.Names()
	if n.User(1000) != "user" || n.Group(27) != "sudo" || n.User(4242) != "4242" {
		t.Fatalf("names: %q %q %q", n.User(1000), n.Group(27), n.User(4242))
	}
}

func TestResolve(t *testing.T) {
	u := &User{Name: "user", Home: "/home/user"}
	for _, tc := range []struct{ in, def, want string }{
		{"", "", "/home/user"},
		{"", "/work", "/work"},
		{"", "rel", "/home/user/rel"},
		{"~", "", "/home/user"},
		{"~/a/../b.txt", "", "/home/user/b.txt"},
		{"a.txt", "/work", "/home/user/a.txt"},
		{"/tmp//x/", "", "/tmp/x"},
	} {
		got, err := u.Resolve(tc.in, tc.def)
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q, %q) = %q, %v; want %q", tc.in, tc.def, got, err, tc.want)
		}
	}
	if _, err := u.Resolve("~root/x", ""); err == nil {
		t.Error("~root expansion should fail")
	}
}
