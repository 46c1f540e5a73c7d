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
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// RootFS gives each sandbox a writable root over a read-only template root.
type RootFS interface {
	Prepare(ctx context.Context, templateRoot, sandboxDir string) (root string, err error)
	Release(ctx context.Context, sandboxDir string) error
}

// NetNS creates the network namespace a sandbox runs in. The networking layer will hand the
// guest its link inside this namespace; today it holds loopback only.
type NetNS interface {
	Create(ctx context.Context, name string) (path string, err error)
	Delete(ctx context.Context, name string) error
	List(ctx context.Context) ([]string, error)
}

// Templates resolves a template id to its read-only root filesystem on this node.
type Templates interface {
	RootFS(ctx context.Context, templateID string) (string, error)
}

// Options configure a Node.
type Options struct {
	DataDir   string
	Runtime   runtime.Runtime
	RootFS    RootFS
	NetNS     NetNS
	Templates Templates
	// EnvdPath is the envd binary bind-mounted into every sandbox.
	EnvdPath string
	// BootTimeout bounds how long a create waits for envd to come up.
	BootTimeout time.Duration
	Log         *slog.Logger
}

const (
	guestBinDir = "/opt/vmon/bin"
	netnsPrefix = "vmon-"
)

var idRe = regexp.MustCompile(`^[a-z0-9]+$`)

// Node runs sandboxes on this host.
type Node struct {
	opts Options
	log  *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*sandbox
}

type sandbox struct {
	id        string
	dir       string
	ch        *agent.Channel
	startedAt time.Time
}

// New returns a node; call Recover before serving.
func New(opts Options) (*Node, error) {
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 60 * time.Second
	}
	if err := os.MkdirAll(filepath.Join(opts.DataDir, "sandboxes"), 0o700); err != nil {
		return nil, fmt.Errorf("create sandboxes dir: %w", err)
	}
	return &Node{opts: opts, log: opts.Log, sandboxes: map[string]*sandbox{}}, nil
}

func (n *Node) sandboxDir(id string) string {
	return filepath.Join(n.opts.DataDir, "sandboxes", id)
}

// CreateSandbox boots a sandbox and returns once envd has accepted its /init.
func (n *Node) CreateSandbox(ctx context.Context, spec CreateSpec) (info Info, retErr error) {
	if !idRe.MatchString(spec.ID) {
		return Info{}, errdefs.InvalidArgument("invalid sandbox id %q", spec.ID)
	}
	templateRoot, err := n.opts.Templates.RootFS(ctx, spec.TemplateID)
	if err != nil {
		return Info{}, err
	}
	dir := n.sandboxDir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return Info{}, fmt.Errorf("create sandbox dir: %w", err)
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

	agentDir := filepath.Join(dir, "agent")
	if err := os.Mkdir(agentDir, 0o755); err != nil {
		return Info{}, fmt.Errorf("create agent dir: %w", err)
	}
	root, err := n.opts.RootFS.Prepare(ctx, templateRoot, dir)
	if err != nil {
		return Info{}, fmt.Errorf("prepare root filesystem: %w", err)
	}
	undo = append(undo, func() { _ = n.opts.RootFS.Release(teardownCtx, dir) })

	nsPath, err := n.opts.NetNS.Create(ctx, netnsPrefix+spec.ID)
	if err != nil {
		return Info{}, fmt.Errorf("create network namespace: %w", err)
	}
	undo = append(undo, func() { _ = n.opts.NetNS.Delete(teardownCtx, netnsPrefix+spec.ID) })

	ch, err := agent.Listen(agentDir, n.log.With("sandbox", spec.ID))
	if err != nil {
		return Info{}, err
	}
	undo = append(undo, func() { _ = ch.Close() })

	rspec := runtime.Spec{
		ID:        spec.ID,
		RootDir:   root,
		StateDir:  dir,
		Hostname:  "vmon",
		NetNSPath: nsPath,
		Mounts: []runtime.Mount{
			{HostPath: agentDir, GuestPath: agentproto.GuestDir},
			{HostPath: filepath.Dir(n.opts.EnvdPath), GuestPath: guestBinDir, ReadOnly: true},
		},
		Args:     []string{guestBinDir + "/" + filepath.Base(n.opts.EnvdPath), "--agent-socket", agentproto.GuestSocket},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		CPUs:     spec.CPUs,
		MemoryMB: spec.MemoryMB,
	}
	if err := n.opts.Runtime.Start(ctx, rspec); err != nil {
		return Info{}, fmt.Errorf("start runtime: %w", err)
	}
	undo = append(undo, func() { _ = n.opts.Runtime.Destroy(teardownCtx, spec.ID) })

	bootCtx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
	defer cancel()
	if err := n.initEnvd(bootCtx, ch, spec); err != nil {
		return Info{}, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox did not start")
	}
	sb := &sandbox{id: spec.ID, dir: dir, ch: ch, startedAt: time.Now()}
	n.mu.Lock()
	n.sandboxes[spec.ID] = sb
	n.mu.Unlock()
	return Info{ID: spec.ID, StartedAt: sb.startedAt, EnvdVersion: agentproto.EnvdVersion}, nil
}

// initEnvd waits for envd and delivers the sandbox's /init state, retrying until it succeeds,
// because envd may be up before its HTTP server accepts streams.
func (n *Node) initEnvd(ctx context.Context, ch *agent.Channel, spec CreateSpec) error {
	body, err := json.Marshal(map[string]any{
		"envVars":        spec.EnvVars,
		"accessToken":    spec.AccessToken,
		"defaultUser":    spec.DefaultUser,
		"defaultWorkdir": spec.DefaultWorkdir,
		"timestamp":      time.Now().UTC().Format(time.RFC3339Nano),
	})
	if err != nil {
		return err
	}
	if err := ch.WaitConnected(ctx); err != nil {
		return err
	}
	client := &http.Client{Transport: ch.Transport()}
	var lastErr error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, envdURL("/init"), bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("envd /init answered %s: %s", resp.Status, bytes.TrimSpace(msg))
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
	n.mu.Lock()
	sb := n.sandboxes[id]
	delete(n.sandboxes, id)
	n.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if err := n.opts.Runtime.Destroy(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("destroy runtime: %w", err))
	}
	if sb != nil {
		_ = sb.ch.Close()
	}
	if err := n.opts.NetNS.Delete(ctx, netnsPrefix+id); err != nil {
		errs = append(errs, fmt.Errorf("delete network namespace: %w", err))
	}
	dir := n.sandboxDir(id)
	if err := n.opts.RootFS.Release(ctx, dir); err != nil {
		errs = append(errs, fmt.Errorf("release root filesystem: %w", err))
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove sandbox dir: %w", err))
	}
	return errors.Join(errs...)
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

// Running lists the ids of the sandboxes this node runs.
func (n *Node) Running() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, 0, len(n.sandboxes))
	for id := range n.sandboxes {
		ids = append(ids, id)
	}
	return ids
}
