package rootfs

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseMountInfo(t *testing.T) {
	in := `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 22 0:33 / /var/lib/vmon/sandboxes/a\040b/root rw,relatime - overlay overlay rw,lowerdir=/t/base/rootfs,upperdir=/s/upper,workdir=/s/work,index=off
40 22 0:4 net:[4026532] /run/netns/vmon-x rw shared:5 master:2 - nsfs nsfs rw
`
	got, err := parseMountInfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []mountEntry{
		{Dev: "0:21", MountPoint: "/", FSType: "ext4", Source: "/dev/vda", SuperOptions: "rw"},
		{Dev: "0:33", MountPoint: "/var/lib/vmon/sandboxes/a b/root", FSType: "overlay", Source: "overlay",
			SuperOptions: "rw,lowerdir=/t/base/rootfs,upperdir=/s/upper,workdir=/s/work,index=off"},
		{Dev: "0:4", MountPoint: "/run/netns/vmon-x", FSType: "nsfs", Source: "nsfs", SuperOptions: "rw"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if l := overlayLowerDirs(got[1].SuperOptions); !reflect.DeepEqual(l, []string{"/t/base/rootfs"}) {
		t.Fatalf("lower dirs = %v", l)
	}
	if _, err := parseMountInfo(strings.NewReader("1 2 3\n")); err == nil {
		t.Fatal("malformed line accepted")
	}
}

func TestValidateDirs(t *testing.T) {
	for _, tc := range []struct {
		lower, sandbox string
		ok             bool
	}{
		{"/t/base/rootfs", "/s/abc", true},
		{"/t/base", "/t/base/x", false},
		{"/t/base/x", "/t/base", false},
		{"/t/base", "/t/base", false},
		{"/t/base", "/t/base2", true},
		{"rel", "/s", false},
		{"/t/a,b", "/s", false},
		{"/t/a", "/s:x", false},
	} {
		if err := validateDirs([]string{tc.lower}, tc.sandbox); (err == nil) != tc.ok {
			t.Errorf("validateDirs(%q, %q) = %v, want ok=%v", tc.lower, tc.sandbox, err, tc.ok)
		}
	}
}
