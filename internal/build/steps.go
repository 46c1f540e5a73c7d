package build

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/template"
)

// Step is one instruction of a build, as the SDK's TemplateBuildStartV2 sends it.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash,omitempty"`
}

// Registry holds the credentials the SDK sends for fromImage (`fromImageRegistry`).
type Registry struct {
	Type     string `json:"type"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Request is one build to run.
type Request struct {
	TemplateID string
	BuildID    string
	// Exactly one of FromImage and FromTemplate (a resolved parent build).
	FromImage         string
	FromImageRegistry *Registry
	FromTemplate      *Parent
	StartCmd          string
	ReadyCmd          string
	// Force rebuilds every step, ignoring the cache.
	Force    bool
	Steps    []Step
	CPUs     int
	MemoryMB int
}

// Parent is a built template a build starts from.
type Parent struct {
	TemplateID, BuildID string
	// Layers are relative to the data dir, topmost first.
	Layers  []string
	Env     map[string]string
	User    string
	Workdir string
}

// ResolveParent is build buildID of template id in dataDir as a parent: its layers (a rootfs
// template's one tree, or a step-built template's stack) and image settings.
func ResolveParent(dataDir, id, buildID string) (*Parent, error) {
	m, err := template.LoadBuild(dataDir, id, buildID)
	if err != nil {
		return nil, err
	}
	layers := m.Layers
	if len(layers) == 0 {
		rel, err := filepath.Rel(dataDir, m.RootfsDir())
		if err != nil || !filepath.IsLocal(rel) {
			return nil, fmt.Errorf("template %s lies outside the data dir", id)
		}
		layers = []string{rel}
	}
	return &Parent{TemplateID: id, BuildID: buildID, Layers: layers, Env: m.Env,
		User: m.DefaultUser, Workdir: m.DefaultWorkdir}, nil
}

var (
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	filesHashRe    = regexp.MustCompile(`^[a-f0-9]{64}$`)
	userSpecRe     = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$`)
)

// MaxSteps bounds a build: every step may add a layer and overlay stacks are bounded.
const MaxSteps = 50

// Validate checks a request before anything runs, so the API can answer 400 at once.
func (r *Request) Validate() error {
	if (r.FromImage == "") == (r.FromTemplate == nil) {
		return errdefs.InvalidArgument("exactly one of fromImage and fromTemplate is required")
	}
	if len(r.Steps) > MaxSteps {
		return errdefs.InvalidArgument("a build may have at most %d steps (got %d)", MaxSteps, len(r.Steps))
	}
	if r.FromImageRegistry != nil && r.FromImageRegistry.Type != "registry" {
		return errdefs.InvalidArgument("fromImageRegistry type %q is not supported (only \"registry\")", r.FromImageRegistry.Type)
	}
	for i, s := range r.Steps {
		if err := s.validate(); err != nil {
			return errdefs.InvalidArgument("step %d (%s): %s", i+1, s.Type, errdefs.PublicMessage(err))
		}
	}
	return nil
}

func (s Step) validate() error {
	switch strings.ToUpper(s.Type) {
	case "RUN":
		if len(s.Args) < 1 || len(s.Args) > 2 || strings.TrimSpace(s.Args[0]) == "" {
			return errdefs.InvalidArgument("RUN takes [command, user?]")
		}
		if len(s.Args) == 2 && s.Args[1] != "" && !userSpecRe.MatchString(s.Args[1]) {
			return errdefs.InvalidArgument("invalid user %q", s.Args[1])
		}
	case "COPY":
		if len(s.Args) < 2 || len(s.Args) > 4 || s.Args[0] == "" || s.Args[1] == "" {
			return errdefs.InvalidArgument("COPY takes [src, dest, user?, mode?]")
		}
		if !filesHashRe.MatchString(s.FilesHash) {
			return errdefs.InvalidArgument("COPY needs a filesHash of 64 hex digits")
		}
		if len(s.Args) > 2 && s.Args[2] != "" && !userSpecRe.MatchString(s.Args[2]) {
			return errdefs.InvalidArgument("invalid user %q", s.Args[2])
		}
		if len(s.Args) > 3 && s.Args[3] != "" {
			if _, err := parseMode(s.Args[3]); err != nil {
				return err
			}
		}
	case "ENV":
		if len(s.Args) == 0 || len(s.Args)%2 != 0 {
			return errdefs.InvalidArgument("ENV takes [name, value, ...]")
		}
		for i := 0; i < len(s.Args); i += 2 {
			if !envNamePattern.MatchString(s.Args[i]) {
				return errdefs.InvalidArgument("invalid variable name %q", s.Args[i])
			}
			if strings.ContainsRune(s.Args[i+1], 0) {
				return errdefs.InvalidArgument("value of %q contains a NUL byte", s.Args[i])
			}
		}
	case "WORKDIR":
		if len(s.Args) != 1 || s.Args[0] == "" || strings.ContainsRune(s.Args[0], 0) {
			return errdefs.InvalidArgument("WORKDIR takes [path]")
		}
	case "USER":
		if len(s.Args) != 1 || !userSpecRe.MatchString(s.Args[0]) {
			return errdefs.InvalidArgument("USER takes [name] (a user name or uid)")
		}
	default:
		return errdefs.InvalidArgument("unknown step type %q (supported: RUN, COPY, ENV, WORKDIR, USER)", s.Type)
	}
	return nil
}

// parseMode reads COPY's mode: an octal string such as "0755".
func parseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errdefs.InvalidArgument("invalid mode %q (want octal, e.g. \"0755\")", s)
	}
	return uint32(m), nil
}

// describe renders a step for logs, the way a Dockerfile would spell it.
func (s Step) describe() string {
	args := s.Args
	switch strings.ToUpper(s.Type) {
	case "RUN":
		d := "RUN " + args[0]
		if len(args) > 1 && args[1] != "" {
			d += " (as " + args[1] + ")"
		}
		return d
	case "ENV":
		var kv []string
		for i := 0; i+1 < len(args); i += 2 {
			kv = append(kv, args[i]+"="+args[i+1])
		}
		return "ENV " + strings.Join(kv, " ")
	default:
		return strings.ToUpper(s.Type) + " " + strings.Join(args, " ")
	}
}

// key is the cache key of a step applied on top of the state keyed parent: the same step over
// the same parent (and, for COPY, the same files) always produces the same result.
func (s Step) key(parent string) string {
	b, _ := json.Marshal(struct {
		Parent    string   `json:"p"`
		Type      string   `json:"t"`
		Args      []string `json:"a"`
		FilesHash string   `json:"f,omitempty"`
	}{parent, strings.ToUpper(s.Type), s.Args, s.FilesHash})
	return hashKey(string(b))
}

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// resolveDir resolves a WORKDIR or COPY destination against the current workdir.
func resolveDir(workdir, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	if workdir == "" {
		workdir = "/"
	}
	return path.Join(workdir, p)
}
