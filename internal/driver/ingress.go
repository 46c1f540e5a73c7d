package driver

import (
	"context"
	"sort"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Route is what ingress needs to forward a request to a running sandbox.
type Route struct {
	ID     string
	NodeID string
	// EnvdAccessToken signs file URLs and authenticates envd calls ("" for insecure sandboxes).
	EnvdAccessToken string
	// TrafficAccessToken must accompany requests to the sandbox's ports when set ("" = public).
	TrafficAccessToken string
	// MaskRequestHost, when set, replaces the Host header of requests to the sandbox's ports,
	// with ${PORT} standing for the port (network.maskRequestHost).
	MaskRequestHost string
}

func routeOf(sb Sandbox) Route {
	r := Route{ID: sb.ID, NodeID: sb.NodeID, EnvdAccessToken: sb.EnvdAccessToken,
		TrafficAccessToken: sb.TrafficAccessToken}
	if n, err := decodeNetwork(sb.Network); err == nil && n.MaskRequestHost != nil {
		r.MaskRequestHost = *n.MaskRequestHost
	}
	return r
}

// SandboxByID returns the route of a running sandbox, or a NotFound error (ingress answers 502).
// It is served from memory: ingress calls it on every request.
func (d *Driver) SandboxByID(_ context.Context, id string) (Route, error) {
	d.mu.Lock()
	r, ok := d.routes[id]
	out := ok && r.NodeID != "" && d.out[r.NodeID]
	d.mu.Unlock()
	if !ok {
		if err := d.checkRecovered(id); err != nil {
			return Route{}, err
		}
		return Route{}, notFound(id)
	}
	if out {
		return Route{}, errdefs.NotFound("sandbox %q cannot be reached: its node %s is out of reach", id, r.NodeID)
	}
	return r, nil
}

// RunningSandboxes returns the routes of all running sandboxes, ordered by id. Ingress uses it to
// find the sandbox a signed file URL belongs to when the request carries no sandbox id.
func (d *Driver) RunningSandboxes(_ context.Context) ([]Route, error) {
	d.mu.Lock()
	out := make([]Route, 0, len(d.routes))
	for _, r := range d.routes {
		out = append(out, r)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
