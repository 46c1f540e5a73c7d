package nodeapi

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
	"github.com/vibemon/vmon/internal/nodeapi/gen/node/nodev1connect"
)

// Client is a remote node. It implements driver.Node and every optional part of it; a part the
// node does not serve answers driver.ErrNotImplemented, as the API's 501.
type Client struct {
	c nodev1connect.NodeServiceClient
}

var (
	_ driver.Node          = (*Client)(nil)
	_ driver.Pauser        = (*Client)(nil)
	_ driver.Snapshotter   = (*Client)(nil)
	_ driver.MetricsNode   = (*Client)(nil)
	_ driver.DeniedWatcher = (*Client)(nil)
)

// NewClient talks to the node served at baseURL through hc.
func NewClient(hc connect.HTTPClient, baseURL string, opts ...connect.ClientOption) *Client {
	return &Client{c: nodev1connect.NewNodeServiceClient(hc, baseURL, opts...)}
}

// NodeInfo is what a node says of itself.
type NodeInfo struct {
	Status
	Capabilities []string
}

// Info asks the node for its features, capabilities and room.
func (c *Client) Info(ctx context.Context) (NodeInfo, error) {
	r, err := c.c.Info(ctx, connect.NewRequest(&nodev1.InfoRequest{}))
	if err != nil {
		return NodeInfo{}, fromWire(err)
	}
	m := r.Msg
	return NodeInfo{Capabilities: m.GetCapabilities(), Status: Status{Features: m.GetFeatures(), FreeMemoryMB: m.GetFreeMemoryMb(),
		FreeSlots: int(m.GetFreeSlots()), FreeDiskMB: m.GetFreeDiskMb(), Load: m.GetLoad(), Templates: m.GetTemplates()}}, nil
}

// ListSandboxes asks the node what it holds.
func (c *Client) ListSandboxes(ctx context.Context) (Holdings, error) {
	r, err := c.c.ListSandboxes(ctx, connect.NewRequest(&nodev1.ListSandboxesRequest{}))
	if err != nil {
		return Holdings{}, fromWire(err)
	}
	return Holdings{Running: r.Msg.GetRunning(), Paused: r.Msg.GetPaused()}, nil
}

func (c *Client) CreateSandbox(ctx context.Context, spec node.CreateSpec) (node.Info, error) {
	ws, err := specToWire(spec)
	if err != nil {
		return node.Info{}, err
	}
	r, err := c.c.CreateSandbox(ctx, connect.NewRequest(&nodev1.CreateSandboxRequest{Spec: ws}))
	if err != nil {
		return node.Info{}, fromWire(err)
	}
	return infoFromWire(r.Msg), nil
}

func (c *Client) DestroySandbox(ctx context.Context, id string) error {
	_, err := c.c.DestroySandbox(ctx, connect.NewRequest(&nodev1.DestroySandboxRequest{Id: id}))
	return fromWire(err)
}

func (c *Client) UpdateEgress(ctx context.Context, id string, p egress.Policy) error {
	b, err := policyToWire(p)
	if err != nil {
		return err
	}
	_, err = c.c.UpdateEgress(ctx, connect.NewRequest(&nodev1.UpdateEgressRequest{Id: id, EgressPolicy: b}))
	return fromWire(err)
}

func (c *Client) PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error) {
	r, err := c.c.PauseSandbox(ctx, connect.NewRequest(&nodev1.PauseSandboxRequest{Id: id, Memory: memory}))
	if err != nil {
		return node.PauseInfo{}, fromWire(err)
	}
	return node.PauseInfo{Memory: r.Msg.GetMemory(), Bytes: r.Msg.GetBytes()}, nil
}

func (c *Client) ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error) {
	ws, err := specToWire(spec)
	if err != nil {
		return node.Info{}, err
	}
	r, err := c.c.ResumeSandbox(ctx, connect.NewRequest(&nodev1.ResumeSandboxRequest{Spec: ws, Memory: memory}))
	if err != nil {
		return node.Info{}, fromWire(err)
	}
	return infoFromWire(r.Msg), nil
}

func (c *Client) DeletePaused(ctx context.Context, id string) error {
	_, err := c.c.DeletePaused(ctx, connect.NewRequest(&nodev1.DeletePausedRequest{Id: id}))
	return fromWire(err)
}

func (c *Client) SnapshotSandbox(ctx context.Context, id, snapID string) (node.PauseInfo, error) {
	r, err := c.c.SnapshotSandbox(ctx, connect.NewRequest(&nodev1.SnapshotSandboxRequest{Id: id, SnapshotId: snapID}))
	if err != nil {
		return node.PauseInfo{}, fromWire(err)
	}
	return node.PauseInfo{Memory: r.Msg.GetMemory(), Bytes: r.Msg.GetBytes()}, nil
}

func (c *Client) CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error) {
	ws, err := specToWire(spec)
	if err != nil {
		return node.Info{}, err
	}
	r, err := c.c.CreateFromSnapshot(ctx, connect.NewRequest(&nodev1.CreateFromSnapshotRequest{Spec: ws, SnapshotId: snapID, PausedId: pausedID}))
	if err != nil {
		return node.Info{}, fromWire(err)
	}
	return infoFromWire(r.Msg), nil
}

func (c *Client) DeleteSnapshot(ctx context.Context, snapID string) error {
	_, err := c.c.DeleteSnapshot(ctx, connect.NewRequest(&nodev1.DeleteSnapshotRequest{SnapshotId: snapID}))
	return fromWire(err)
}

// PublishSnapshot has the node put snapshot snapID in the cluster's store.
func (c *Client) PublishSnapshot(ctx context.Context, snapID string) error {
	_, err := c.c.PublishSnapshot(ctx, connect.NewRequest(&nodev1.PublishSnapshotRequest{SnapshotId: snapID}))
	return fromWire(err)
}

func (c *Client) SandboxMetrics(ctx context.Context, id string) (node.Metrics, error) {
	r, err := c.c.SandboxMetrics(ctx, connect.NewRequest(&nodev1.SandboxMetricsRequest{Id: id}))
	if err != nil {
		return node.Metrics{}, fromWire(err)
	}
	return metricsFromWire(r.Msg), nil
}

// WatchDenied opens the node's refusal stream: the node answers at once with what it holds (or
// why it cannot), then the channel carries each new refusal until cancel.
func (c *Client) WatchDenied(id string) ([]node.DeniedEvent, <-chan node.DeniedEvent, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.c.WatchDenied(ctx, connect.NewRequest(&nodev1.WatchDeniedRequest{Id: id}))
	if err != nil {
		cancel()
		return nil, nil, nil, fromWire(err)
	}
	if !stream.Receive() {
		err := stream.Err()
		_ = stream.Close()
		cancel()
		if err == nil {
			err = errdefs.Unavailable("the node ended the refusal stream before it opened")
		}
		return nil, nil, nil, fromWire(err)
	}
	var recent []node.DeniedEvent
	for _, e := range stream.Msg().GetRecent() {
		recent = append(recent, deniedFromWire(e))
	}
	ch := make(chan node.DeniedEvent, 64)
	go func() {
		defer close(ch)
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if ev == nil {
				continue
			}
			select {
			case ch <- deniedFromWire(ev):
			case <-ctx.Done():
				return
			}
		}
	}()
	return recent, ch, cancel, nil
}

// HTTPClient is what NewClient needs of an *http.Client.
var _ connect.HTTPClient = (*http.Client)(nil)
