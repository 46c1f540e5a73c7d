// Package node owns the lifecycle of the sandboxes on one host: it assembles each sandbox from a
// template root, a network namespace, the agent channel and a runtime backend, rolls partial
// setups back, and after a crash adopts what survived and removes what nothing owns. It never
// reads API keys or sandbox records (that is the driver's job) and never talks to the guest
// network.
package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/atomicfile"
	"github.com/vibemon/vmon/internal/denied"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/limits"
	"github.com/vibemon/vmon/internal/netpool"
	"github.com/vibemon/vmon/internal/rootimage"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/snapshot"
)

// RootFS gives each sandbox a writable root over a template's read-only layers.
type RootFS interface {
	// Prepare mounts the root; w says how big the writable layer is and whether it is a saved
	// one brought back (resume, snapshots) instead of a fresh one.
	Prepare(ctx context.Context, lowers []string, sandboxDir string, w Writable) (root string, err error)
	Release(ctx context.Context, sandboxDir string) error
	// Stash unmounts the root and moves the writable layer into dst (pause, a failed resume).
	Stash(ctx context.Context, sandboxDir, dst string) error
	// CopyWritable copies the writable layer of a stopped sandbox into dst (snapshots).
	CopyWritable(ctx context.Context, sandboxDir, dst string) error
	// Commit stops the root's mount and moves the sandbox's writes to dst (template builds).
	Commit(ctx context.Context, sandboxDir, dst string) error
}

// RootImages hands out read-only images of template roots with envd inside (internal/rootimage):
// a sandbox booted from one needs no gofer and no mounts on the host.
type RootImages interface {
	// Lookup returns the image of lowers with the envd build in envdDir when it is built, and
	// otherwise starts building it and reports false.
	Lookup(lowers []string, envdDir string) (rootimage.Image, bool)
	// ForRestore returns the image for a checkpoint taken on the image at path: that one if it
	// is here, else this node's image of lowers and envdDir, built if missing (its path differs
	// when this node keeps the layers elsewhere; the caller compares digests).
	ForRestore(ctx context.Context, path string, lowers []string, envdDir string) (rootimage.Image, error)
	// Build returns the image of lowers with the envd build in envdDir, building it now if it is
	// missing (a template's start check, which must run on the image its sandboxes restore on).
	Build(ctx context.Context, lowers []string, envdDir string) (rootimage.Image, error)
}

// Writable describes a sandbox's writable layer.
type Writable struct {
	// DiskMB caps what the sandbox can write (0: no cap, template builds).
	DiskMB int
	// From is a directory holding a layer saved by Stash to bring back; Copy keeps it there.
	From string
	Copy bool
}

// NetNS creates the network namespace a sandbox runs in. The networking layer will hand the
// guest its link inside this namespace; today it holds loopback only.
type NetNS interface {
	Create(ctx context.Context, name string) (path string, err error)
	Delete(ctx context.Context, name string) error
	List(ctx context.Context) ([]string, error)
}

// Network hands out per-sandbox links (a lease, the host link vmon<N> and a namespace holding the
// guest end) and enforces egress policy on them (*netpool.Pool).
type Network interface {
	Take(ctx context.Context) (*netpool.Link, error)
	// TakeUnrestricted returns a link without egress hooks (template builds).
	TakeUnrestricted(ctx context.Context) (*netpool.Link, error)
	Attach(ctx context.Context, l *netpool.Link, p egress.Policy) error
	Update(ctx context.Context, l *netpool.Link, p egress.Policy) error
	// Prepare readies a link for a runtime restored into the namespace it ran in before.
	Prepare(ctx context.Context, l *netpool.Link) error
	Release(ctx context.Context, l *netpool.Link) error
	// ReleaseLater is Release in the background, for links whose sandbox is gone.
	ReleaseLater(l *netpool.Link)
	// Recover hands back the links recovered sandboxes hold and removes every other one.
	Recover(ctx context.Context, held []netpool.LinkID) (map[netpool.LinkID]*netpool.Link, error)
}

// Image is what a template build gives its sandboxes.
type Image struct {
	// Lowers are the read-only layers, topmost first.
	Lowers []string
	// Env is set for every process; the sandbox's own envVars override it.
	Env map[string]string
	// StartCmd is started in every new sandbox, which is handed out once ReadyCmd exits 0.
	StartCmd, ReadyCmd string
	// StartSnapshot, when set, is a snapshot of a sandbox of this build with StartCmd running
	// and ready (made at the end of the build): new sandboxes are restored from it instead.
	StartSnapshot string
}

// Templates resolves a template build to its image on this node. An empty buildID is the
// template's current build.
type Templates interface {
	Image(ctx context.Context, templateID, buildID string) (Image, error)
}

// Options configure a Node.
type Options struct {
	DataDir string
	Runtime runtime.Runtime
	RootFS  RootFS
	// NetNS makes loopback-only namespaces when Network is nil (a node that cannot network).
	NetNS NetNS
	// Network gives sandboxes their uplink and egress policy; nil leaves them loopback only.
	Network Network
	// EgressProxy reports that Network's links redirect to a running transparent egress proxy,
	// so allowOut domains, header rules and SOCKS5 egress proxies are enforced (the
	// egress-domains and egress-proxy features).
	EgressProxy bool
	// CABundle is the node's egress CA (PEM), sent to every sandbox's envd in /init so guests
	// trust the certificates of intercepted HTTPS flows.
	CABundle []byte
	// Denied collects what the node refused each sandbox (nil: not reported). Env explains the
	// kernel's refusals with the node's always-denied ranges.
	Denied *denied.Hub
	Env    egress.Env
	// Names, when set, tells which name a guest resolved an address for (the filtering
	// resolver), to name the destinations of refusals.
	Names interface {
		NameOf(guest, addr netip.Addr) (string, bool)
	}
	Templates Templates
	// EnvdPath is the envd binary bind-mounted into every sandbox.
	EnvdPath string
	// RootImages, when set, gives sandboxes without volumes a root image (once it is built)
	// instead of an overlay root and envd's bind mount.
	RootImages RootImages
	// DiskMB is the disk of the sandboxes of templates that set none (--sandbox-disk-mb). A
	// template's start check on a root image runs with it: runsc restores a checkpoint only with
	// the root size it was taken with, so the started snapshot serves the creates of that size.
	DiskMB int
	// BootTimeout bounds how long a boot waits for envd to come up.
	BootTimeout time.Duration
	// ReadyTimeout bounds how long a create waits for a template's ready command to succeed.
	ReadyTimeout time.Duration
	// NetNSPrefix starts the names of this node's network namespaces. Namespaces are host-global,
	// so it must differ between nodes sharing a host (each recovery removes its own orphans).
	NetNSPrefix string
	// Warm lists the pre-started sandboxes to keep per template shape (the warm path).
	Warm []WarmSpec
	// Limits override the task and open-file limits derived from each sandbox's memory.
	Limits limits.Overrides
	// MaxSnapshotBytes bounds the disk paused sandboxes take together (0: no bound).
	MaxSnapshotBytes int64
	// VolumePath gives the host directory of a volume (internal/volumes); nil: no volumes.
	VolumePath func(id string) (string, error)
	// GuestLog takes what envd reports about each handed-out sandbox; nil: not followed.
	GuestLog GuestLog
	Log      *slog.Logger
}

const (
	// GuestBinDir is where every sandbox sees the node's envd directory: envd and the other
	// guest programs installed with it (the code-execution service).
	GuestBinDir = "/opt/vmon/bin"
	// sandboxIDFile names, inside a sandbox's directory, the API sandbox id it was handed to. Its
	// absence marks a pre-started sandbox nobody claimed, which recovery discards.
	sandboxIDFile = "sandbox-id"
	// accessTokenFile keeps the envd access token so a restarted node can still call envd.
	accessTokenFile = "access-token"
	// linkFile records the sandbox's link, for recovery to hand it back.
	linkFile = "link"
	// policyFile records the sandbox's egress policy: the kernel keeps the chains across a node
	// restart, but the egress proxy's view of the sandbox must be rebuilt from it.
	policyFile = "egress.json"
)

var idRe = regexp.MustCompile(`^[a-z0-9]+$`)

// Node runs sandboxes on this host.
type Node struct {
	opts Options
	log  *slog.Logger
	pool *pool
	// ctx ends the runtime watchers at Close.
	ctx    context.Context
	cancel context.CancelFunc

	// pausedUsage and snapsUsage remember what each paused sandbox's and each snapshot's files
	// take, for the budget check.
	pausedUsage, snapsUsage snapshot.Usage
	// snapMu serialises the budget check; snapReserved is what the pauses and snapshots it let
	// through may still write before their snapshot is published.
	snapMu sync.Mutex
	// +checklocks:snapMu
	snapReserved int64

	mu sync.Mutex
	// sandboxes are keyed by API sandbox id.
	// +checklocks:mu
	sandboxes map[string]*sandbox
	// onStopped hears about handed-out sandboxes whose runtime stopped on its own; until it is
	// set, such events wait in pendingStops.
	// +checklocks:mu
	onStopped func(id string, exit runtime.Exit)
	// +checklocks:mu
	pendingStops []stopEvent
	// finishing holds the paused sandboxes whose snapshot is still being written (closed when
	// done); finishWG lets Close wait for them.
	// +checklocks:mu
	finishing map[string]chan struct{}
	finishWG  sync.WaitGroup
}

type stopEvent struct {
	id   string
	exit runtime.Exit
}

// sandbox is one booted sandbox. runtimeID names its directory, network namespace and runtime
// container; it equals the API id unless the sandbox was pre-started before it had one.
type sandbox struct {
	runtimeID string
	id        string
	template  string
	cpus      int
	memoryMB  int
	// token is envd's access token, sent on the node's own envd calls.
	token string
	// link is the sandbox's uplink (nil without networking); attached says its policy is in force.
	link      *netpool.Link
	attached  bool
	ch        *agent.Channel
	startedAt time.Time
	// root is the merged root filesystem on the host (to look at the image, never to write);
	// empty for a sandbox on a root image.
	root string
	// shell runs the node's own commands in the guest (shellFor).
	shell []string
	// stopping is set when the node itself tears the sandbox down, so its runtime's exit is
	// expected rather than news.
	stopping atomic.Bool
	// restored says the sandbox came back from a checkpoint: its processes (the template's start
	// command among them) are already running.
	restored bool
	// envdToken is the access token envd holds from before a restore (a snapshot's), which /init
	// must prove to install the sandbox's own.
	envdToken string
	// policy is the egress policy in force (recordPolicy), to explain the kernel's refusals.
	policy atomic.Pointer[egress.Policy]
	// follow is the copy of envd's events into the sandbox's log (followGuest).
	follow atomic.Pointer[follower]
	// memHint is what the node told envd of its memory (watchMemory).
	memHint memHintState
}

// New returns a node; call Recover before serving and Close at exit.
func New(opts Options) (*Node, error) {
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 60 * time.Second
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.NetNSPrefix == "" {
		opts.NetNSPrefix = "vmon-"
	}
	for _, d := range []string{"sandboxes", "root-layers"} {
		if err := os.MkdirAll(filepath.Join(opts.DataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create %s dir: %w", d, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{opts: opts, log: opts.Log, sandboxes: map[string]*sandbox{}, finishing: map[string]chan struct{}{},
		ctx: ctx, cancel: cancel}
	n.pool = newPool(n, opts.Warm)
	go n.watchMemory()
	return n, nil
}

func (n *Node) sandboxDir(runtimeID string) string {
	return filepath.Join(n.opts.DataDir, "sandboxes", runtimeID)
}

// CreateSandbox hands out a sandbox and returns once envd has accepted its /init: a pre-started
// one of the same shape when the warm pool has it, else a freshly booted one.
func (n *Node) CreateSandbox(ctx context.Context, spec CreateSpec) (Info, error) {
	if !idRe.MatchString(spec.ID) {
		return Info{}, errdefs.InvalidArgument("invalid sandbox id %q", spec.ID)
	}
	img, err := n.opts.Templates.Image(ctx, spec.TemplateID, spec.BuildID)
	if err != nil {
		return Info{}, err
	}
	if img.StartSnapshot != "" && len(spec.Volumes) == 0 { // the snapshot was taken without them
		info, err := n.createFromStart(ctx, spec, img)
		if err == nil {
			return info, nil
		}
		// The snapshot is an optimisation: the start command still works the slow way.
		level := slog.LevelWarn
		if errors.Is(err, errStartDisk) {
			level = slog.LevelInfo
		}
		n.log.Log(ctx, level, "restoring the template's started snapshot failed; running its start command instead",
			"template", spec.TemplateID, "err", err)
	}
	var sb *sandbox
	if len(spec.Volumes) == 0 { // pre-started sandboxes have no volumes
		sb = n.pool.take(spec)
	}
	if sb != nil {
		info, err := n.handOut(ctx, sb, spec, img)
		if err == nil {
			return info, nil
		}
		// A pre-started sandbox that cannot be initialised is broken; boot a fresh one instead.
		n.log.Warn("pre-started sandbox failed; booting a new one", "runtime_id", sb.runtimeID, "err", err)
	}
	sb, err = n.boot(ctx, bootSpec{runtimeID: spec.ID, templateID: spec.TemplateID, lowers: img.Lowers,
		cpus: spec.CPUs, memoryMB: spec.MemoryMB, diskMB: spec.DiskMB, policy: &spec.Egress, volumes: spec.Volumes})
	if err != nil {
		return Info{}, err
	}
	return n.handOut(ctx, sb, spec, img)
}

// handOut binds a booted sandbox to its API id, delivers /init and starts the template's start
// command; on failure it is destroyed.
func (n *Node) handOut(ctx context.Context, sb *sandbox, spec CreateSpec, img Image) (Info, error) {
	spec.EnvVars = mergeEnv(img.Env, spec.EnvVars)
	sb.id, sb.token = spec.ID, spec.AccessToken
	dir := n.sandboxDir(sb.runtimeID)
	// The token goes first: a sandbox-id file marks a handed-out sandbox, which recovery adopts.
	err := writeFileAtomic(filepath.Join(dir, accessTokenFile), []byte(spec.AccessToken))
	if err == nil {
		err = n.recordPolicy(sb, spec.Egress)
	}
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, sandboxIDFile), []byte(spec.ID))
	}
	if err == nil {
		// A pre-started sandbox's link is still closed. Its policy goes in alongside /init: both
		// finish before create returns, so before the sandbox's first instruction.
		var link *netpool.Link
		if !sb.attached {
			link = sb.link
		}
		attached := n.attachAsync(ctx, link, spec.Egress)
		bootCtx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
		err = n.initEnvd(bootCtx, sb, spec)
		cancel()
		err = errors.Join(err, <-attached)
		sb.attached = sb.link != nil
	}
	if err == nil && img.StartCmd != "" && !sb.restored {
		err = n.startTemplateCmd(ctx, sb, spec, img)
	}
	if err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), sb)
		return Info{}, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox did not start")
	}
	sb.startedAt = time.Now()
	n.mu.Lock()
	n.sandboxes[spec.ID] = sb
	n.mu.Unlock()
	n.followGuest(sb)
	return Info{ID: spec.ID, StartedAt: sb.startedAt, EnvdVersion: agentproto.EnvdVersion}, nil
}

// attachAsync puts p in force on link in the background and reports the result; a nil link
// (no networking, or already attached) reports success at once.
func (n *Node) attachAsync(ctx context.Context, link *netpool.Link, p egress.Policy) <-chan error {
	done := make(chan error, 1)
	if link == nil {
		done <- nil
		return done
	}
	go func() { done <- n.opts.Network.Attach(ctx, link, p) }()
	return done
}

// bootSpec is what boot assembles a sandbox from.
type bootSpec struct {
	runtimeID, templateID string
	lowers                []string
	cpus, memoryMB        int
	// diskMB caps the sandbox's writes (0: no cap, template builds).
	diskMB int
	// envd is the host directory of the envd build to mount ("": the running one); a restore
	// needs the build its checkpoint was taken with (envdFor).
	envd string
	// policy, when set, is attached to the link while the runtime starts (the pool boots with
	// none: its links stay closed until a create hands the sandbox out).
	policy *egress.Policy
	// unrestricted gives a template build's sandbox a link without egress hooks.
	unrestricted bool
	// layer, when set, is a saved writable layer to bring back (moved unless copyLayer).
	layer     string
	copyLayer bool
	// checkpoint, when set, is a runtime image to restore instead of booting init; channel says
	// how the envd it holds gets its agent channel (snapshot.Meta.Channel).
	checkpoint string
	channel    string
	// rootImage is the root image a checkpoint was taken on (its writable layer is in the
	// checkpoint); no Path for a fresh boot, which takes one from RootImages when it can.
	rootImage rootimage.Image
	// mark names a file created in the sandbox directory before anything else (resumingFile).
	mark string
	// gate, when set, must pass before the root filesystem is prepared (a snapshot's checksums,
	// verified while the link's policy goes in).
	gate func() error
	// volumes are mounted into the guest (a checkpoint restores only with the mounts it had).
	volumes []VolumeMount
}

// boot assembles and starts a sandbox up to a connected envd (not yet initialised).
func (n *Node) boot(ctx context.Context, bs bootSpec) (_ *sandbox, retErr error) {
	bootStart := time.Now()
	runtimeID, templateID, lowers, cpus, memoryMB, policy := bs.runtimeID, bs.templateID, bs.lowers, bs.cpus, bs.memoryMB, bs.policy
	dir := n.sandboxDir(runtimeID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox dir: %w", err)
	}
	var undo []func()
	defer func() {
		if retErr == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()
	teardownCtx := context.WithoutCancel(ctx)
	undo = append(undo, func() { _ = os.RemoveAll(dir) })
	if bs.mark != "" {
		if err := writeFileAtomic(filepath.Join(dir, bs.mark), nil); err != nil {
			return nil, fmt.Errorf("mark sandbox dir: %w", err)
		}
	}

	var link *netpool.Link
	var nsPath string
	var err error
	attached := func() error { return nil }
	if n.opts.Network != nil {
		// A ready link: its namespace holds the guest end with only a placeholder address (the
		// lease comes with /init), its chains are closed until the sandbox is handed out.
		take := n.opts.Network.Take
		if bs.unrestricted {
			take = n.opts.Network.TakeUnrestricted
		}
		if link, err = take(ctx); err != nil {
			return nil, fmt.Errorf("take a network link: %w", err)
		}
		// Attaching runs iptables-restore; it overlaps with preparing the root filesystem and
		// starting the runtime, which need no network. A pre-started sandbox's link stays
		// closed until a create hands it out; a build's has no hooks.
		attachLink, attachPolicy := link, egress.Policy{}
		if bs.unrestricted || policy == nil {
			attachLink = nil
		} else {
			attachPolicy = *policy
		}
		done := n.attachAsync(ctx, attachLink, attachPolicy)
		attached = sync.OnceValue(func() error { return <-done })
		undo = append(undo, func() {
			_ = attached() // never release a link an attach is still writing to
			_ = n.opts.Network.Release(teardownCtx, link)
		})
		if err := writeFileAtomic(filepath.Join(dir, linkFile), []byte(strconv.Itoa(int(link.ID())))); err != nil {
			return nil, fmt.Errorf("record network link: %w", err)
		}
		nsPath = link.NetNSPath()
	} else {
		if nsPath, err = n.opts.NetNS.Create(ctx, n.opts.NetNSPrefix+runtimeID); err != nil {
			return nil, fmt.Errorf("create network namespace: %w", err)
		}
		undo = append(undo, func() { _ = n.opts.NetNS.Delete(teardownCtx, n.opts.NetNSPrefix+runtimeID) })
	}
	if bs.gate != nil {
		// Checked while the policy goes in, before anything uses what it checks.
		if err := bs.gate(); err != nil {
			return nil, err
		}
	}

	envdDir := n.envdDir(bs)
	image, useImage := n.rootImage(bs, envdDir)
	var root string
	shell := loginShell(image.Bash)
	// On an image nothing is mounted: the writable layer is a file runsc creates (and unlinks)
	// in the node's layers directory.
	if !useImage {
		if root, err = n.opts.RootFS.Prepare(ctx, lowers, dir, Writable{DiskMB: bs.diskMB, From: bs.layer, Copy: bs.copyLayer}); err != nil {
			return nil, fmt.Errorf("prepare root filesystem: %w", err)
		}
		shell = shellFor(root)
	}
	undo = append(undo, func() { _ = n.releaseRoot(teardownCtx, runtimeID) })

	lim := limits.Derive(memoryMB, n.opts.Limits)
	mode := channelControl
	if bs.checkpoint != "" {
		mode = bs.channel
	}
	rspec := runtime.Spec{
		ID:        runtimeID,
		RootDir:   root,
		StateDir:  dir,
		Hostname:  "vmon",
		NetNSPath: nsPath,
		Mounts:    []runtime.Mount{{HostPath: envdDir, GuestPath: GuestBinDir, ReadOnly: true}},
		// envd also serves on the guest's loopback, as E2B's does (its own token guards it):
		// guest services such as the code interpreter read the sandbox's variables there.
		Args: []string{n.guestEnvd(), "--agent-fd", strconv.Itoa(runtime.FirstFile),
			"--max-tasks", strconv.Itoa(lim.GuestTasks), "--listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(agentproto.EnvdPort))},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		CPUs:     cpus,
		MemoryMB: memoryMB,
		Limits:   lim,
	}
	if useImage {
		rspec.RootDir, rspec.RootImage, rspec.Mounts = n.imageLayers(), image.Path, nil
		rspec.RootSizeBytes = int64(bs.diskMB) << 20
	}
	var ch *agent.Channel
	var ctl *agentctl.Conn
	switch mode {
	case channelDialled:
		// A checkpoint of an envd that dials a socket in a host directory (vmon before the
		// control socket): the directory must be where it was.
		agentDir := filepath.Join(dir, "agent")
		if err := os.Mkdir(agentDir, 0o755); err != nil {
			return nil, fmt.Errorf("create agent dir: %w", err)
		}
		if ch, err = agent.Listen(agentDir, n.log.With("runtime_id", runtimeID)); err != nil {
			return nil, err
		}
		undo = append(undo, func() { _ = ch.Close() })
		// Read-only: connecting to the socket works on a read-only mount, and the guest must
		// not create files or symlinks in a host directory.
		rspec.Mounts = append([]runtime.Mount{{HostPath: agentDir, GuestPath: agentproto.GuestDir, ReadOnly: true}}, rspec.Mounts...)
	case channelControl:
		var guest *os.File
		if ctl, guest, err = agentctl.Pair(); err != nil {
			return nil, err
		}
		// The runtime holds its own copy once it started; ours goes either way.
		defer guest.Close()
		host := ctl
		undo = append(undo, func() { _ = host.Close() })
		rspec.Files = []*os.File{guest}
	}
	for _, v := range bs.volumes {
		if n.opts.VolumePath == nil {
			return nil, errdefs.Unavailable("this node has no volumes")
		}
		host, err := n.opts.VolumePath(v.ID)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(host); err != nil || !fi.IsDir() {
			return nil, errdefs.NotFound("volume %q is missing on this node", v.ID)
		}
		rspec.Mounts = append(rspec.Mounts, runtime.Mount{HostPath: host, GuestPath: v.Path})
	}
	if err := writeBootRecord(dir, n.opts.DataDir, envdDir, bs, rspec, mode, image.Digest, shell); err != nil {
		return nil, err
	}
	sb := &sandbox{runtimeID: runtimeID, template: templateID, cpus: cpus, memoryMB: memoryMB,
		link: link, attached: link != nil && policy != nil, root: root, shell: shell, restored: bs.checkpoint != ""}
	if bs.checkpoint != "" {
		// The restore overlaps with the attach, as a cold start does: the guest's interface
		// comes back from the namespace with the placeholder address only, and the link's chains
		// stay closed until the policy is in, so nothing leaves before both the policy and the
		// lease (pushed once the attach is done) are in place.
		cp, ok := n.opts.Runtime.(runtime.Checkpointer)
		if !ok {
			return nil, errdefs.Unavailable("this node's runtime cannot restore checkpoints")
		}
		if err := cp.Restore(ctx, rspec, bs.checkpoint); err != nil {
			return nil, fmt.Errorf("restore runtime: %w", err)
		}
	} else if err := n.opts.Runtime.Start(ctx, rspec); err != nil {
		return nil, fmt.Errorf("start runtime: %w", err)
	}
	undo = append(undo, func() {
		sb.stopping.Store(true)
		_ = n.opts.Runtime.Destroy(teardownCtx, runtimeID)
	})
	if mode != channelDialled {
		if mode == channelHandoff {
			// The restored envd's control socket was handed to it after a node restart, and
			// such a one does not survive a restore: hand it a new one.
			if ctl, err = n.handoff(ctx, runtimeID); err != nil {
				return nil, fmt.Errorf("agent channel: %w", err)
			}
		}
		if ch, err = agent.Attach(ctl, n.log.With("runtime_id", runtimeID)); err != nil {
			return nil, fmt.Errorf("agent channel: %w", err)
		}
		undo = append(undo, func() { _ = ch.Close() })
	}
	sb.ch = ch
	n.watch(sb)

	if err := attached(); err != nil {
		return nil, fmt.Errorf("attach egress policy: %w", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
	defer cancel()
	if err := ch.WaitConnected(waitCtx); err != nil {
		return nil, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox did not start")
	}
	n.log.Debug("sandbox booted", "runtime_id", runtimeID, "restored", bs.checkpoint != "", "took", time.Since(bootStart))
	return sb, nil
}

// envdDir is the host directory of the envd build sandbox bs runs: the one its checkpoint holds,
// or the node's.
func (n *Node) envdDir(bs bootSpec) string {
	if bs.envd != "" {
		return bs.envd
	}
	return filepath.Dir(n.opts.EnvdPath)
}

// imageLayers is the directory where runsc keeps the files behind the writable layers of the
// sandboxes on root images (each created and unlinked at once). It is one directory for all of
// them: a restore must name the same one as its checkpoint, and forks restore one sandbox's
// checkpoint as others.
func (n *Node) imageLayers() string { return filepath.Join(n.opts.DataDir, "root-layers") }

// rootImage says whether sandbox bs boots from a root image, and which. A restore of a
// checkpoint taken on one must. A fresh boot does when the node has images and the image of its
// layers and envd is built, unless the sandbox has volumes (their mounts need a gofer anyway), a
// saved writable layer on the host, or is a template build (its writes become a layer on the
// host).
func (n *Node) rootImage(bs bootSpec, envdDir string) (rootimage.Image, bool) {
	if bs.rootImage.Path != "" {
		return bs.rootImage, true
	}
	if n.opts.RootImages == nil || bs.checkpoint != "" || bs.layer != "" || bs.unrestricted || len(bs.volumes) > 0 {
		return rootimage.Image{}, false
	}
	return n.opts.RootImages.Lookup(bs.lowers, envdDir)
}

// initEnvd waits for envd and delivers the sandbox's /init state, retrying until it succeeds,
// because envd may be up before its HTTP server accepts streams. With a link, /init also pushes
// the guest's address and default route: guests run no DHCP client, and until this push a
// gVisor guest holds only a link-local placeholder.
func (n *Node) initEnvd(ctx context.Context, sb *sandbox, spec CreateSpec) error {
	init := map[string]any{
		"envVars":        spec.EnvVars,
		"accessToken":    spec.AccessToken,
		"defaultUser":    spec.DefaultUser,
		"defaultWorkdir": spec.DefaultWorkdir,
		"timestamp":      time.Now().UTC().Format(time.RFC3339Nano),
		"vmonSandboxID":  spec.ID,
	}
	if sb.link != nil {
		init["vmonNetwork"] = sb.link.GuestNet()
	}
	if len(n.opts.CABundle) > 0 {
		init["caBundle"] = string(n.opts.CABundle)
	}
	// envd needs the current token to replace one; after a restore /init is sent again, and a
	// sandbox restored from another's snapshot holds that one's token.
	current := spec.AccessToken
	if sb.envdToken != "" {
		current = sb.envdToken
	}
	return n.sendInit(ctx, sb, init, current)
}

// pushNetwork sends the sandbox's lease alone through /init: after a restore in place the guest's
// interface is new and holds only the placeholder address.
func (n *Node) pushNetwork(ctx context.Context, sb *sandbox) error {
	if sb.link == nil {
		return nil
	}
	return n.sendInit(ctx, sb, map[string]any{"vmonNetwork": sb.link.GuestNet()}, sb.token)
}

// sendInit posts init to envd, proving token, until envd accepts it or refuses the request itself.
func (n *Node) sendInit(ctx context.Context, sb *sandbox, init map[string]any, token string) error {
	body, err := json.Marshal(init)
	if err != nil {
		return err
	}
	if err := sb.ch.WaitConnected(ctx); err != nil {
		return err
	}
	client := &http.Client{Transport: sb.ch.Transport()}
	var lastErr error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, envdURL("/init"), bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := client.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("envd /init answered %s: %s", resp.Status, bytes.TrimSpace(msg))
			if resp.StatusCode < 500 {
				return err // a verdict on the request itself: sending it again changes nothing
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("envd init: %w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func envdURL(path string) string {
	return "http://" + net.JoinHostPort("127.0.0.1", fmt.Sprint(agentproto.EnvdPort)) + path
}

// DestroySandbox stops a sandbox and removes everything it owned; a gone sandbox is success.
func (n *Node) DestroySandbox(ctx context.Context, id string) error {
	if !idRe.MatchString(id) {
		return errdefs.InvalidArgument("invalid sandbox id %q", id)
	}
	// A resume's spent snapshot must be gone before the teardown looks for it.
	if err := n.waitFinished(ctx, id); err != nil {
		return err
	}
	n.mu.Lock()
	sb := n.sandboxes[id]
	delete(n.sandboxes, id)
	n.mu.Unlock()
	if sb == nil {
		// Unknown here (e.g. its runtime died before a restart): clean up by id.
		sb = &sandbox{runtimeID: id}
	}
	return n.teardown(context.WithoutCancel(ctx), sb)
}

// teardown removes a sandbox's runtime, channel, link or namespace, root and directory.
func (n *Node) teardown(ctx context.Context, sb *sandbox) error {
	sb.stopping.Store(true)
	if f := sb.stopFollowing(); f != nil {
		// envd holds back its last events for a moment to send them together: read what it
		// holds once more, or the last things a killed sandbox did never reach its log.
		n.drainGuest(ctx, sb, f)
	}
	n.forgetDenied(sb.id)
	runtimeID := sb.runtimeID
	var errs []error
	if err := n.opts.Runtime.Destroy(ctx, runtimeID); err != nil {
		errs = append(errs, fmt.Errorf("destroy runtime: %w", err))
	}
	if sb.ch != nil {
		_ = sb.ch.Close()
	}
	if sb.link != nil && len(errs) > 0 {
		// The runtime may still be sending on the link: keep it out of the pool. The next
		// start-up removes a link no recovered sandbox holds.
		n.log.Warn("keeping the network link of a sandbox whose runtime did not stop", "sandbox", sb.id, "link", sb.link.Name())
	} else if sb.link != nil {
		// After the runtime is gone, so nothing sends on the link any more: it goes back to the
		// pool closed, its conntrack state flushed, so the next sandbox on this lease inherits
		// nothing. That runs in the background; a Take waits for it only when no lease is free.
		n.opts.Network.ReleaseLater(sb.link)
	} else if n.opts.NetNS == nil {
		// Networked node: a link nobody holds is the pool's to remove at recovery.
	} else if err := n.opts.NetNS.Delete(ctx, n.opts.NetNSPrefix+runtimeID); err != nil {
		errs = append(errs, fmt.Errorf("delete network namespace: %w", err))
	}
	if err := n.releaseRoot(ctx, runtimeID); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Running is how many sandboxes the node holds for the driver (the warm pool's are not counted).
func (n *Node) Running() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.sandboxes)
}

// RunningIDs are the sandboxes the node holds for the driver, sorted.
func (n *Node) RunningIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.sandboxes))
}

// Holds reports whether sandbox id runs here or is paused here.
func (n *Node) Holds(id string) bool {
	n.mu.Lock()
	_, ok := n.sandboxes[id]
	n.mu.Unlock()
	if ok {
		return true
	}
	if !idRe.MatchString(id) {
		return false
	}
	_, err := os.Stat(n.pausedDir(id))
	return err == nil
}

// Channel returns the agent channel of a running sandbox.
func (n *Node) Channel(id string) (*agent.Channel, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return nil, false
	}
	return sb.ch, true
}

func (n *Node) lookup(id string) (*sandbox, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	return sb, ok
}

// Close stops refilling the warm pool and destroys the pre-started sandboxes nobody claimed.
// Handed-out sandboxes keep running; the next start adopts them.
func (n *Node) Close(ctx context.Context) error {
	err := n.pool.close(ctx)
	n.finishWG.Wait() // pauses in flight end with a published snapshot
	n.cancel()
	return err
}

// writeFileAtomic replaces a sandbox's state file whole; a restart rebuilds what a power cut
// loses.
func writeFileAtomic(path string, data []byte) error { return atomicfile.Replace(path, data, 0o600) }
