package rootfs

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// mountEntry is the part of one /proc/<pid>/mountinfo line this package needs.
type mountEntry struct {
	// Dev is the filesystem's device number, "major:minor" (st_dev of its files).
	Dev        string
	MountPoint string
	FSType     string
	Source     string
	// SuperOptions are the per-superblock options, e.g. overlayfs's lowerdir=....
	SuperOptions string
}

// parseMountInfo parses the mountinfo format (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// The optional fields before "-" vary in number, so the separator is searched for.
func parseMountInfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || len(fields) < sep+3 {
			return nil, fmt.Errorf("malformed mountinfo line %q", line)
		}
		e := mountEntry{
			Dev:        fields[2],
			MountPoint: unescapeOctal(fields[4]),
			FSType:     fields[sep+1],
			Source:     unescapeOctal(fields[sep+2]),
		}
		if len(fields) > sep+3 {
			e.SuperOptions = unescapeOctal(fields[sep+3])
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// overlayLowerDirs returns the lower layers named in an overlay mount's super options.
func overlayLowerDirs(superOptions string) []string {
	for _, opt := range strings.Split(superOptions, ",") {
		if v, ok := strings.CutPrefix(opt, "lowerdir="); ok {
			return strings.Split(v, ":")
		}
	}
	return nil
}
