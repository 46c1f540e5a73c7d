package tasklimit

import (
	"strings"
	"testing"
)

// The layout gVisor gives a container whose spec mounts cgroups at /sys/fs/cgroup.
const (
	gvisorCgroup = "3:cpuset:/sbx1\n7:pids:/sbx1\n1:cpu:/sbx1\n"
	gvisorMounts = `26 19 0:27 / /sys/fs/cgroup rw - tmpfs none rw
27 26 0:10 /sbx1 /sys/fs/cgroup/cpu rw - cgroup none rw,cpu
33 26 0:16 /sbx1 /sys/fs/cgroup/pids rw - cgroup none rw,pids
`
)

func TestLimitFile(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, mounts, want, err string
	}{
		{name: "gvisor container", cgroup: gvisorCgroup, mounts: gvisorMounts, want: "/sys/fs/cgroup/pids/pids.max"},
		{name: "nested cgroup", cgroup: "7:pids:/sbx1/sub\n", mounts: gvisorMounts, want: "/sys/fs/cgroup/pids/sub/pids.max"},
		{name: "host-style root mount", cgroup: "5:pids:/a/b\n",
			mounts: "40 1 0:40 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n", want: "/sys/fs/cgroup/pids/a/b/pids.max"},
		{name: "combined controllers", cgroup: "5:cpu,pids:/x\n",
			mounts: "40 1 0:40 / /cg rw - cgroup cgroup rw,cpu,pids\n", want: "/cg/x/pids.max"},
		{name: "no pids controller", cgroup: "3:cpuset:/sbx1\n", mounts: gvisorMounts, err: "no pids cgroup"},
		{name: "not mounted", cgroup: gvisorCgroup, mounts: "26 19 0:27 / /sys/fs/cgroup rw - tmpfs none rw\n", err: "not mounted"},
		{name: "outside the mount", cgroup: "7:pids:/other\n", mounts: gvisorMounts, err: "outside"},
	} {
		path, err := cgroupPath(strings.NewReader(tc.cgroup), "pids")
		var point, root string
		if err == nil {
			point, root, err = mountOf(strings.NewReader(tc.mounts), "pids")
		}
		var got string
		if err == nil {
			var dir string
			dir, err = cgroupDir(point, root, path)
			got = dir + "/pids.max"
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
