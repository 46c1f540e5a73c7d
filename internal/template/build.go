package template

import (
	"io"
	"log/slog"
	"slices"
)

// BaseOptions configure BuildBase.
type BaseOptions struct {
	// DataDir is vmon's data directory; the template goes to <DataDir>/templates/base.
	DataDir string
	// Force rebuilds even if a built template exists.
	Force bool
	// Suite is the Debian release; empty means bookworm.
	Suite string
	// Sources are apt one-line entries ("deb URI SUITE COMPONENTS"); empty means the host's own
	// entries for Suite (its configured mirror), or Debian's public mirrors if it has none.
	Sources []string
	// ExtraPackages are installed in addition to BasePackages.
	ExtraPackages []string
	// CacheDir keeps downloaded .debs between builds; empty means <DataDir>/cache/apt-archives.
	CacheDir string
	// Mmdebstrap is the mmdebstrap binary; empty means from PATH.
	Mmdebstrap string
	// Progress receives human-readable progress lines (the CLI shows them); may be nil.
	Progress io.Writer
	Logger   *slog.Logger
}

// BasePackages are what E2B's base template offers: a shell, Python with pip, Node with npm, git
// (including git daemon), curl, sudo, process and network tools, xattr tools and a compiler
// toolchain, plus a pager, an editor and an ssh client.
var BasePackages = []string{
	"bash", "python3", "python3-pip", "python-is-python3", "nodejs", "npm", "git", "curl",
	"ca-certificates", "sudo", "procps", "iproute2", "attr", "build-essential",
	"less", "vim-tiny", "openssh-client",
	// Resolves the sandbox's own hostname (set per sandbox, absent from /etc/hosts), which sudo
	// looks up on every call.
	"libnss-myhostname",
}

// CodeInterpreterRootfsID is the template the code-interpreter-v1 template is made from: base's
// packages plus CodeInterpreterPackages and the code-execution service.
const CodeInterpreterRootfsID = "code-interpreter-v1-rootfs"

// CodeInterpreterPackages are what E2B's code-interpreter template offers that Debian packages:
// Python with ipykernel and the data stack, R with IRkernel, TypeScript for Node.js, and a JDK
// (jshell runs Java cells).
var CodeInterpreterPackages = []string{
	"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-scipy",
	"python3-sklearn", "python3-seaborn", "python3-plotly",
	"r-base-core", "r-cran-irkernel", "node-typescript", "openjdk-17-jdk-headless",
}

// MissingPackages lists the packages of want a built template's manifest does not have: a
// rootfs built by an older vmon lacks what was added since, and is built again.
func (m Manifest) MissingPackages(want []string) []string {
	var out []string
	for _, p := range want {
		if !slices.Contains(m.Packages, p) {
			out = append(out, p)
		}
	}
	return out
}

// Resources and user of sandboxes made from base, as E2B's base template.
const (
	baseCPUs     = 2
	baseMemoryMB = 512
	defaultUser  = "user"
	defaultHome  = "/home/user"
)

func (o BaseOptions) packages() []string {
	pkgs := append(slices.Clone(BasePackages), o.ExtraPackages...)
	slices.Sort(pkgs)
	return slices.Compact(pkgs)
}
