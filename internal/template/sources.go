package template

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// aptSource is one "deb" entry of an apt sources list.
type aptSource struct {
	URI        string
	Suite      string
	Components []string
	SignedBy   string
}

// line renders the entry in one-line format, which mmdebstrap takes as a MIRROR argument.
func (s aptSource) line() string {
	opts := ""
	if s.SignedBy != "" {
		opts = "[signed-by=" + s.SignedBy + "] "
	}
	return fmt.Sprintf("deb %s%s %s %s", opts, s.URI, s.Suite, strings.Join(s.Components, " "))
}

// forSuite reports whether an entry belongs to suite's main archive, updates or security. Other
// suites (backports, third-party repositories like nodesource) are left out so the template is
// plain Debian.
func (s aptSource) forSuite(suite string) bool {
	return s.Suite == suite || s.Suite == suite+"-updates" || s.Suite == suite+"-security" ||
		s.Suite == suite+"/updates"
}

// hostSources returns the host's apt entries for suite as one-line sources, read the way apt reads
// them: /etc/apt/sources.list plus *.list and *.sources in sources.list.d (other files, e.g.
// disabled ones, are ignored). If none match, Debian's public mirrors are used.
func hostSources(etcApt, suite string) ([]string, error) {
	var all []aptSource
	if b, err := os.ReadFile(filepath.Join(etcApt, "sources.list")); err == nil {
		all = append(all, parseOneLine(string(b))...)
	}
	files, err := filepath.Glob(filepath.Join(etcApt, "sources.list.d", "*"))
	if err != nil {
		return nil, fmt.Errorf("list apt sources: %w", err)
	}
	sort.Strings(files)
	for _, f := range files {
		var parse func(string) []aptSource
		switch {
		case strings.HasSuffix(f, ".list"):
			parse = parseOneLine
		case strings.HasSuffix(f, ".sources"):
			parse = parseDeb822
		default:
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read apt sources: %w", err)
		}
		all = append(all, parse(string(b))...)
	}
	var lines []string
	seen := map[string]bool{}
	for _, s := range all {
		if !s.forSuite(suite) {
			continue
		}
		if l := s.line(); !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		lines = []string{
			"deb http://deb.debian.org/debian " + suite + " main",
			"deb http://deb.debian.org/debian " + suite + "-updates main",
			"deb http://deb.debian.org/debian-security " + suite + "-security main",
		}
	}
	return lines, nil
}

// parseOneLine parses sources.list(5) one-line entries; only "deb" lines are kept.
func parseOneLine(text string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		var s aptSource
		if strings.HasPrefix(f[0], "[") {
			// Options: [key=value key=value]
			end := 0
			for end < len(f) && !strings.HasSuffix(f[end], "]") {
				end++
			}
			if end == len(f) {
				continue
			}
			for _, o := range f[:end+1] {
				o = strings.Trim(o, "[]")
				if v, ok := strings.CutPrefix(o, "signed-by="); ok {
					s.SignedBy = v
				}
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			continue
		}
		s.URI, s.Suite, s.Components = f[0], f[1], f[2:]
		out = append(out, s)
	}
	return out
}

// parseDeb822 parses sources.list(5) deb822 stanzas; each stanza expands to one entry per type
// "deb", URI and suite.
func parseDeb822(text string) []aptSource {
	var out []aptSource
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		fields := map[string]string{}
		key := ""
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if line[0] == ' ' || line[0] == '\t' {
				if key != "" { // continuation line
					fields[key] += " " + strings.TrimSpace(line)
				}
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			fields[key] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") || !hasWord(fields["types"], "deb") {
			continue
		}
		signedBy := fields["signed-by"]
		if strings.ContainsAny(signedBy, " \t") {
			signedBy = "" // an inline key block, not a keyring path; apt falls back to its keyrings
		}
		for _, uri := range strings.Fields(fields["uris"]) {
			for _, suite := range strings.Fields(fields["suites"]) {
				out = append(out, aptSource{
					URI: uri, Suite: suite, Components: strings.Fields(fields["components"]),
					SignedBy: signedBy,
				})
			}
		}
	}
	return out
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// HostSources returns this machine's apt entries for suite as one-line sources (Debian's public
// mirrors if it has none), as the base template's build uses them: other builds from Debian
// packages (the container image's root, cmd/vmon-image) take the same mirror.
func HostSources(suite string) ([]string, error) { return hostSources("/etc/apt", suite) }
