// Package driver owns sandbox records and their lifecycle: it validates what clients ask for,
// resolves templates, reserves capacity, asks a node to boot or destroy sandboxes, enforces
// timeouts, recovers state after a restart, and answers ingress lookups from memory.
//
// It talks to nodes only through the Node interface below (in-process for `--role all`, an RPC
// client when split) and to persistence only through the store. It never touches runtimes,
// network namespaces, files or HTTP; the api package turns its errors into E2B responses.
package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/keylock"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/secrets"
	"github.com/vibemon/vmon/internal/store"
)

// Node is what the driver needs from a node. Implementations must treat destroying a sandbox that
// is already gone as success, and roll back their own partial work when a create fails.
type Node interface {
	// CreateSandbox boots a sandbox whose egress policy (spec.Egress) is in force before its first
	// instruction runs.
	CreateSandbox(ctx context.Context, spec node.CreateSpec) (node.Info, error)
	DestroySandbox(ctx context.Context, id string) error
	// UpdateEgress replaces a running sandbox's egress policy for new flows. On error the previous
	// policy must still be in force; an unknown id is a NotFound error.
	UpdateEgress(ctx context.Context, id string, p egress.Policy) error
}

// MetricsNode is optionally implemented by a Node that can sample a sandbox's resource use. Without
// it, Metrics reports the sandbox's configured limits only.
type MetricsNode interface {
	SandboxMetrics(ctx context.Context, id string) (Metric, error)
}

// Metric is one resource sample of a sandbox (bytes for memory and disk).
type Metric = node.Metrics

// Sandbox is a sandbox record as the driver hands it out.
type Sandbox = store.Sandbox

// ErrNotImplemented marks features vmon does not support yet (pause, auto-pause, volumes); the API
// answers 501 for it.
var ErrNotImplemented = errors.New("not supported yet")

// CapacityErrorCode is E2B's error_code for a node that cannot take more sandboxes.
const CapacityErrorCode = "sandbox_capacity_unavailable"

// Clock abstracts time so tests can drive expiry without sleeping.
type Clock interface {
	Now() time.Time
	// At returns a channel that receives once the clock reaches t (at once if it already has).
	At(t time.Time) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) At(t time.Time) <-chan time.Time { return time.After(time.Until(t)) }

// Options configure a Driver. Store, Node and Logger are required.
type Options struct {
	Store  *store.Store
	Node   Node
	Logger *slog.Logger
	// NodeID is recorded on each sandbox so a multi-node driver can tell them apart; "" is fine for
	// one node.
	NodeID string
	// Clock defaults to the real clock.
	Clock Clock
	// BootConcurrency is how many sandboxes may boot at once (`--boot-concurrency`); default 4.
	BootConcurrency int
	// BootQueueTimeout bounds how long a create waits for a boot slot before failing with 503;
	// default 30 s, so a client never waits forever behind a stuck boot.
	BootQueueTimeout time.Duration
	// CreateTimeout bounds one node create call; default 2 min.
	CreateTimeout time.Duration
	// MaxSandboxes caps sandboxes that are starting or running on the node (derived from host
	// memory by the caller); 0 means no cap. Past it, creates fail with 429.
	MaxSandboxes int
	// DefaultDiskMB is the disk (writable layer) size of sandboxes whose template sets none; 0
	// leaves their writes uncapped.
	DefaultDiskMB int
	// DefaultTimeout applies when a create or connect gives none; default 300 s (E2B's v2 default).
	DefaultTimeout time.Duration
	// MaxTimeout is the largest timeout a client may ask for (`--max-sandbox-timeout`); default 24 h.
	MaxTimeout time.Duration
	// Features are what the node can do: FeatureNetTap or FeatureNetUser when it can network
	// sandboxes at all, egress.FeatureDomains and egress.FeatureProxy when it enforces those parts
	// of a policy. Creates the node cannot serve fail with 503 sandbox_no_compatible_node; in
	// particular, without a net-* feature every create fails (seed "Network modes").
	Features []string
	// FeaturesNow, when set, replaces Features with what the nodes offer as of each call (a
	// cluster's nodes come and go).
	FeaturesNow func() []string
	// NetworkStore records live network updates; nil uses Store. Tests inject failures here.
	NetworkStore NetworkStore
	// Volumes makes and removes volume directories; nil: volumes answer 501.
	Volumes VolumeDirs
	// Secrets seals secret values at rest; nil: the secrets API answers 501 and header rules
	// with secret placeholders are refused.
	Secrets *secrets.Sealer
	// Logs keeps each sandbox's log of what happened to it (internal/sandboxlog); nil: the logs
	// API answers 501 and nothing is written.
	Logs SandboxLog
	// Observer is told how each create, pause, resume and fork ended (internal/metrics); nil:
	// nobody.
	Observer Observer
	// Name is this driver's name, recorded on the records it makes: several drivers may share one
	// store, and each must tell its own interrupted creates from another's creates under way.
	Name string
	// Leader, when set, is whether this driver is the one among those sharing the store that
	// expires sandboxes; the others keep the same schedule and take over when it changes. nil:
	// this driver is alone and always expires.
	Leader Leader
}

// Leader is the expiry leadership (store.Leadership).
type Leader interface {
	Leading() bool
	// Changed returns a channel closed at the next change of Leading.
	Changed() <-chan struct{}
}

// Observer is told how each sandbox operation ended and how long it took, as its caller saw it,
// and of the sandboxes a fork made (a create's are counted with the create).
type Observer interface {
	SandboxOp(op, template string, took time.Duration, err error)
	SandboxesMade(template string, count int)
}

// observe tells the observer, if any, how op on a sandbox of template went since start.
func (d *Driver) observe(op, template string, start time.Time, err error) {
	if d.opts.Observer != nil {
		d.opts.Observer.SandboxOp(op, template, time.Since(start), err)
	}
}

// Driver orchestrates sandboxes. Create it with New, call Recover before serving, Close at exit.
type Driver struct {
	store    *store.Store
	netStore NetworkStore
	node     Node
	log      *slog.Logger
	clock    Clock
	opts     Options

	bootSlots chan struct{}
	// bootWaiting counts the boots waiting for a slot (metrics).
	bootWaiting atomic.Int32
	// createMu makes the capacity check and the insert of the reserving record one step.
	createMu sync.Mutex
	// locks serialise operations on one sandbox (kill, timeout changes, expiry).
	locks keylock.Map

	mu sync.Mutex
	// routes are the running sandboxes ingress may reach, kept in memory for the hot path.
	routes map[string]Route // +checklocks:mu
	// deadlines holds the current expiry per running sandbox; heap entries that disagree with it
	// are stale and skipped.
	deadlines map[string]time.Time // +checklocks:mu
	heap      deadlineHeap         // +checklocks:mu
	// recovering holds the sandboxes a restart found that the node is still settling (Recover,
	// Recovered): the API answers 503 for them meanwhile.
	recovering map[string]bool // +checklocks:mu
	// out holds the nodes out of reach (NodeOut): their sandboxes' traffic fails at once.
	out map[string]bool // +checklocks:mu

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a Driver and starts its expiry loop.
func New(opts Options) (*Driver, error) {
	if opts.Store == nil || opts.Node == nil || opts.Logger == nil {
		return nil, errors.New("driver: Store, Node and Logger are required")
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.BootConcurrency <= 0 {
		opts.BootConcurrency = 4
	}
	if opts.BootQueueTimeout <= 0 {
		opts.BootQueueTimeout = 30 * time.Second
	}
	if opts.CreateTimeout <= 0 {
		opts.CreateTimeout = 2 * time.Minute
	}
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = 300 * time.Second
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	if opts.DefaultTimeout > opts.MaxTimeout {
		return nil, fmt.Errorf("driver: default timeout %v exceeds max timeout %v", opts.DefaultTimeout, opts.MaxTimeout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	netStore := opts.NetworkStore
	if netStore == nil {
		netStore = opts.Store
	}
	d := &Driver{
		store:      opts.Store,
		netStore:   netStore,
		node:       opts.Node,
		log:        opts.Logger,
		clock:      opts.Clock,
		opts:       opts,
		bootSlots:  make(chan struct{}, opts.BootConcurrency),
		routes:     map[string]Route{},
		out:        map[string]bool{},
		deadlines:  map[string]time.Time{},
		recovering: map[string]bool{},
		wake:       make(chan struct{}, 1),
		cancel:     cancel,
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.reapLoop(ctx)
	}()
	return d, nil
}

// Close stops the expiry loop and waits for expiry kills in flight. Sandboxes keep running; a
// restarted driver recovers them.
func (d *Driver) Close() error {
	d.cancel()
	d.wg.Wait()
	return nil
}

// MaxTimeout returns the largest timeout a client may ask for.
func (d *Driver) MaxTimeout() time.Duration { return d.opts.MaxTimeout }

// now is the driver's notion of the current time, truncated to what the store keeps so that
// in-memory and stored times compare equal.
func (d *Driver) now() time.Time {
	return d.clock.Now().UTC().Truncate(time.Millisecond)
}
