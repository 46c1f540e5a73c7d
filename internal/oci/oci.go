// Package oci fetches OCI and Docker images from registries and unpacks their flattened
// filesystem into a directory, which the template builder then turns into a root filesystem.
//
// It owns everything between an image reference and a populated directory: reference parsing,
// registry mirrors, credentials, platform selection (always linux/amd64) and layer extraction
// with whiteouts. It must never touch anything outside the target directory, although it runs
// as root on the host and the layers are untrusted input, and it never runs image content:
// binaries in the image are only ever written, never executed.
package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/types"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Options configures a Puller.
type Options struct {
	// Mirrors maps a registry host as written in references to a mirror host[:port] that is used
	// instead of it. "docker.io" and "index.docker.io" are the same key.
	Mirrors map[string]string
	// Insecure lists registry hosts (host[:port]) reached over plain HTTP, typically local
	// mirrors. Loopback hosts are always allowed plain HTTP.
	Insecure []string
	// DockerConfig is a docker config.json path for credentials; "" means the default keychain
	// ($DOCKER_CONFIG, ~/.docker/config.json).
	DockerConfig string
	// Log gets debug lines and warnings about dropped metadata; nil means slog.Default().
	Log *slog.Logger
}

// Credentials are explicit registry credentials, typically from a build request; they override
// the keychain.
type Credentials struct{ Username, Password string }

// ImageConfig is the part of an image's config that decides how its processes start.
type ImageConfig struct {
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Image is a resolved linux/amd64 image whose layers have not been fetched yet.
type Image struct {
	// Ref is the reference as given, normalised (e.g. index.docker.io/library/busybox:latest).
	Ref string
	// Digest is the linux/amd64 image manifest digest ("sha256:..."), a stable cache key.
	Digest string
	Config ImageConfig

	img v1.Image
	// reopen gets a handle on the same manifest bound to another context: ggcr keeps the
	// context an image was fetched with for its layer downloads, and Resolve's context may be
	// gone by the time Unpack runs.
	reopen func(ctx context.Context) (v1.Image, error)
}

// Puller fetches and unpacks images. It is safe for concurrent use.
type Puller struct {
	mirrors  map[string]string
	insecure map[string]bool
	keychain authn.Keychain
	log      *slog.Logger
}

// New returns a Puller configured by o.
func New(o Options) *Puller {
	p := &Puller{
		mirrors:  map[string]string{},
		insecure: map[string]bool{},
		keychain: authn.DefaultKeychain,
		log:      o.Log,
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	for from, to := range o.Mirrors {
		p.mirrors[canonicalHost(from)] = to
	}
	for _, h := range o.Insecure {
		p.insecure[canonicalHost(h)] = true
	}
	if o.DockerConfig != "" {
		p.keychain = fileKeychain{path: o.DockerConfig}
	}
	return p
}

// canonicalHost spells a registry host the way ggcr reports it, so that "docker.io" in the
// configuration matches references that ggcr normalises to "index.docker.io".
func canonicalHost(h string) string {
	if r, err := name.NewRegistry(h); err == nil {
		return r.RegistryStr()
	}
	return h
}

// Resolve fetches the manifest (picking linux/amd64 from an index) and the config, but no layers.
func (p *Puller) Resolve(ctx context.Context, ref string, creds *Credentials) (*Image, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err, "invalid image reference %q", ref)
	}
	src, err := p.source(parsed)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err, "invalid registry mirror for %q", ref)
	}
	if src.Context().RegistryStr() != parsed.Context().RegistryStr() {
		p.log.DebugContext(ctx, "using registry mirror", "ref", parsed.Name(), "mirror", src.Context().RegistryStr())
	}

	desc, err := remote.Get(src, p.remoteOptions(ctx, creds)...)
	if err != nil {
		return nil, classify(ctx, err, ref)
	}

	var img v1.Image
	var digest v1.Hash
	switch mt := desc.MediaType; {
	case mt.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, classify(ctx, err, ref)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, classify(ctx, err, ref)
		}
		child, ok := pickAmd64(im.Manifests)
		if !ok {
			return nil, errdefs.InvalidArgument("image %q has no linux/amd64 variant", ref)
		}
		digest = child.Digest
		img, err = remote.Image(src.Context().Digest(digest.String()), p.remoteOptions(ctx, creds)...)
		if err != nil {
			return nil, classify(ctx, err, ref)
		}
	case mt.IsImage():
		digest = desc.Digest
		if img, err = desc.Image(); err != nil {
			return nil, classify(ctx, err, ref)
		}
	case mt.IsSchema1():
		return nil, errdefs.InvalidArgument("image %q uses the unsupported Docker schema 1 manifest format", ref)
	default:
		return nil, errdefs.InvalidArgument("%q is not a container image (media type %s)", ref, mt)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return nil, classify(ctx, err, ref)
	}
	// A single-platform image carries its platform only in the config; an arm64-only image
	// must fail here rather than boot into exec format errors.
	if (cf.OS != "" && cf.OS != "linux") || (cf.Architecture != "" && cf.Architecture != "amd64") {
		return nil, errdefs.InvalidArgument("image %q has no linux/amd64 variant", ref)
	}

	pinned := src.Context().Digest(digest.String())
	return &Image{
		Ref:    parsed.Name(),
		Digest: digest.String(),
		Config: ImageConfig{
			Env:        cf.Config.Env,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
		},
		img: img,
		reopen: func(ctx context.Context) (v1.Image, error) {
			return remote.Image(pinned, p.remoteOptions(ctx, creds)...)
		},
	}, nil
}

// source rewrites ref to the host it is actually fetched from: a mirror if one is configured,
// over plain HTTP when that host is listed as insecure.
func (p *Puller) source(ref name.Reference) (name.Reference, error) {
	host := ref.Context().RegistryStr()
	if m, ok := p.mirrors[host]; ok {
		host = m
	}
	var opts []name.Option
	if p.insecure[canonicalHost(host)] {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(host, opts...)
	if err != nil {
		return nil, fmt.Errorf("registry host %q: %w", host, err)
	}
	repo := reg.Repo(ref.Context().RepositoryStr())
	switch r := ref.(type) {
	case name.Digest:
		return repo.Digest(r.DigestStr()), nil
	case name.Tag:
		return repo.Tag(r.TagStr()), nil
	default:
		return nil, fmt.Errorf("unsupported reference type %T", ref)
	}
}

// remoteOptions binds a request to ctx and to its credentials. Explicit credentials are sent to
// whichever host serves the pull, mirror included: mirrors are configured by the operator and
// trusted as much as the registry they stand for.
func (p *Puller) remoteOptions(ctx context.Context, creds *Credentials) []remote.Option {
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithUserAgent("vmon"),
	}
	if creds != nil && (creds.Username != "" || creds.Password != "") {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: creds.Username, Password: creds.Password}))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(p.keychain))
	}
	return opts
}

// pickAmd64 returns the linux/amd64 image of an index. A plain "amd64" entry wins over
// microarchitecture variants (v2, v3...), which not every host CPU can run.
func pickAmd64(ms []v1.Descriptor) (v1.Descriptor, bool) {
	var found *v1.Descriptor
	for i := range ms {
		d := &ms[i]
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != "amd64" {
			continue
		}
		if d.MediaType != "" && !d.MediaType.IsImage() {
			continue
		}
		if d.Platform.Variant == "" || d.Platform.Variant == "v1" {
			return *d, true
		}
		if found == nil {
			found = d
		}
	}
	if found == nil {
		return v1.Descriptor{}, false
	}
	return *found, true
}

// fileKeychain reads credentials from one docker config.json, chosen by the operator, instead of
// the per-user locations authn.DefaultKeychain searches.
type fileKeychain struct{ path string }

func (k fileKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	f, err := os.Open(k.path)
	if err != nil {
		return nil, fmt.Errorf("open docker config: %w", err)
	}
	defer f.Close()
	cf, err := config.LoadFromReader(f)
	if err != nil {
		return nil, fmt.Errorf("parse docker config %s: %w", k.path, err)
	}
	// Same lookup order as authn.DefaultKeychain: repository first, then registry, with Docker
	// Hub stored under its historical key.
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		ac, err := cf.GetAuthConfig(key)
		if err != nil {
			return nil, fmt.Errorf("docker config credentials for %s: %w", key, err)
		}
		ac.ServerAddress = ""
		if ac != (types.AuthConfig{}) {
			return authn.FromConfig(authn.AuthConfig{
				Username:      ac.Username,
				Password:      ac.Password,
				Auth:          ac.Auth,
				IdentityToken: ac.IdentityToken,
				RegistryToken: ac.RegistryToken,
			}), nil
		}
	}
	return authn.Anonymous, nil
}

var errNoHandle = errors.New("image was not returned by Resolve")
