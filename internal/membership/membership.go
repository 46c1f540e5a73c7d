// Package membership owns who is in a vmon cluster: drivers and nodes gossip with
// hashicorp/memberlist, each advertising a small Meta (role, RPC address, state, placement
// features), and every member learns of joins, changes and failures within seconds.
//
// memberlist carries at most 512 bytes of metadata per member, so only what placement filters on
// goes there; what can grow (free capacity, the templates a node holds) travels over the node's
// RPC (Info), asked by the driver when it needs it. Gossip is encrypted with the cluster's gossip
// key, which a node receives when it joins, so a stranger on the network can neither read nor
// forge members.
//
// It never places sandboxes, dials RPC addresses or decides what a failure means: it reports.
package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Roles.
const (
	RoleDriver = "driver"
	RoleNode   = "node"
)

// States a node advertises.
const (
	StateReady    = "ready"
	StateDraining = "draining"
)

// Meta is what a member advertises to all others.
type Meta struct {
	Role string `json:"r"`
	// RPC is where the member serves (a node's contract, a driver's join endpoint).
	RPC      string   `json:"a,omitempty"`
	State    string   `json:"s,omitempty"`
	Features []string `json:"f,omitempty"`
}

// Member is one member as this one sees it.
type Member struct {
	Name string
	// Gossip is the member's gossip address.
	Gossip string
	Meta   Meta
	// Alive is false once the member failed or left (it stays listed until reaped); Left says
	// it left on purpose rather than failed.
	Alive, Left bool
}

// Event kinds.
type EventKind int

const (
	Joined EventKind = iota
	Updated
	Left
)

func (k EventKind) String() string {
	return [...]string{"joined", "updated", "left"}[k]
}

// Options configure Start.
type Options struct {
	Name string
	// Bind is the gossip listener, host:port (port 0 picks one).
	Bind string
	// Advertise is the address others reach this member at; empty means Bind's.
	Advertise string
	// Join are members to contact: host:port, or a DNS name that resolves to several (a
	// Kubernetes headless Service); all of them are tried.
	Join []string
	Meta Meta
	// SecretKey (16, 24 or 32 bytes) encrypts gossip; nil leaves it in the clear (tests only).
	SecretKey []byte
	// OnEvent, when set, hears of every change of another member, on one goroutine in order.
	OnEvent func(Member, EventKind)
	// Local tunes failure detection for one host (tests): faster probes, shorter suspicion.
	Local bool
	Log   *slog.Logger
}

// Cluster is this member's view.
type Cluster struct {
	ml     *memberlist.Memberlist
	events chan memberlist.NodeEvent
	done   chan struct{}

	name   string
	gossip string

	mu sync.Mutex
	// +checklocks:mu
	meta []byte
	// members is the others as the events told of them: memberlist's own node structures change
	// under its lock, which a reader here cannot take, so only the copies events carry are read.
	// +checklocks:mu
	members map[string]Member
}

// Start joins (or, with no Join addresses that answer, starts) the cluster.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Name == "" {
		return nil, errors.New("membership: a name is required")
	}
	meta, err := encodeMeta(o.Meta)
	if err != nil {
		return nil, err
	}
	cfg := memberlist.DefaultLANConfig()
	if o.Local {
		cfg = memberlist.DefaultLocalConfig()
	}
	cfg.Name = o.Name
	host, port, err := splitHostPort(o.Bind)
	if err != nil {
		return nil, fmt.Errorf("membership: gossip address: %w", err)
	}
	cfg.BindAddr, cfg.BindPort = host, port
	if o.Advertise != "" {
		if cfg.AdvertiseAddr, cfg.AdvertisePort, err = splitHostPort(o.Advertise); err != nil {
			return nil, fmt.Errorf("membership: advertise address: %w", err)
		}
	}
	if o.SecretKey != nil {
		cfg.SecretKey = o.SecretKey
	}
	logger := o.Log
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// memberlist logs through the standard logger; its lines go to slog at debug.
	cfg.Logger = log.New(slogWriter{logger}, "", 0)
	c := &Cluster{events: make(chan memberlist.NodeEvent, 256), done: make(chan struct{}), meta: meta, name: o.Name,
		members: map[string]Member{}}
	cfg.Delegate = delegate{c}
	cfg.Events = &memberlist.ChannelEventDelegate{Ch: c.events}
	ml, err := memberlist.Create(cfg)
	if err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	c.ml = ml
	c.gossip = ml.LocalNode().Address()
	go c.deliver(o.Name, o.OnEvent)
	if len(o.Join) > 0 {
		if _, err := ml.Join(o.Join); err != nil {
			_ = ml.Shutdown()
			close(c.done)
			return nil, fmt.Errorf("membership: join %v: %w", o.Join, err)
		}
	}
	return c, nil
}

// deliver turns memberlist's events into Members for fn, skipping this member's own.
func (c *Cluster) deliver(self string, fn func(Member, EventKind)) {
	for {
		select {
		case <-c.done:
			return
		case ev := <-c.events:
			if ev.Node == nil || ev.Node.Name == self {
				continue
			}
			kind := Joined
			switch ev.Event {
			case memberlist.NodeUpdate:
				kind = Updated
			case memberlist.NodeLeave:
				kind = Left
			}
			m := memberOf(ev.Node, kind != Left)
			m.Left = kind == Left && ev.Node.State == memberlist.StateLeft
			c.mu.Lock()
			if kind == Left {
				delete(c.members, m.Name)
			} else {
				c.members[m.Name] = m
			}
			c.mu.Unlock()
			if fn != nil {
				fn(m, kind)
			}
		}
	}
}

func memberOf(n *memberlist.Node, alive bool) Member {
	m := Member{Name: n.Name, Gossip: n.Address(), Alive: alive}
	_ = json.Unmarshal(n.Meta, &m.Meta)
	return m
}

// Members lists the members this one believes alive, itself included, sorted by name.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	out := []Member{{Name: c.name, Gossip: c.gossip, Alive: true}}
	_ = json.Unmarshal(c.meta, &out[0].Meta)
	for _, m := range c.members {
		out = append(out, m)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Join contacts addrs (as Options.Join) and returns how many answered: a member that started
// alone, or lost every other, joins again through it.
func (c *Cluster) Join(addrs []string) (int, error) {
	n, err := c.ml.Join(addrs)
	if err != nil {
		return n, fmt.Errorf("membership: join %v: %w", addrs, err)
	}
	return n, nil
}

// SetMeta changes what this member advertises and gossips it at once.
func (c *Cluster) SetMeta(m Meta, timeout time.Duration) error {
	b, err := encodeMeta(m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.meta = b
	c.mu.Unlock()
	return c.ml.UpdateNode(timeout)
}

// Leave tells the others this member goes, then stops gossiping.
func (c *Cluster) Leave(timeout time.Duration) error {
	err := c.ml.Leave(timeout)
	return errors.Join(err, c.Shutdown())
}

// Shutdown stops gossiping without a word: the others find out as from a failure.
func (c *Cluster) Shutdown() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	close(c.done)
	return c.ml.Shutdown()
}

// LocalGossip is this member's gossip address as others reach it.
func (c *Cluster) LocalGossip() string { return c.gossip }

func encodeMeta(m Meta) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership: metadata of %d bytes is past gossip's %d", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

func splitHostPort(s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", s)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// delegate hands memberlist this member's metadata; it keeps no other state in gossip.
type delegate struct{ c *Cluster }

func (d delegate) NodeMeta(limit int) []byte {
	d.c.mu.Lock()
	defer d.c.mu.Unlock()
	if len(d.c.meta) > limit {
		return nil
	}
	return slices.Clone(d.c.meta)
}
func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug("memberlist", "msg", string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
