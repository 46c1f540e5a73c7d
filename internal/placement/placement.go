// Package placement decides which node a new sandbox goes to. It is pure: given the nodes as the
// driver last heard of them (features, state, capacity, templates held) and what the sandbox
// needs, it returns the nodes to try, best first. It never calls a node; the driver tries them in
// order and moves to the next one that answers "full".
//
// The order: only ready nodes with every feature the request needs and room for it (memory,
// sandbox slots, disk); among them, those that already hold the template first (no fetch before
// the boot); then, like E2B's orchestrator, a few candidates sampled at random and the least
// loaded of them first, which spreads load without every driver piling onto the one emptiest node.
// Unlike a full sort by load, sampling needs no fresh view of every node, and two drivers deciding
// at once rarely pick the same node.
package placement

import (
	"cmp"
	"math/rand/v2"
	"slices"

	"github.com/vibemon/vmon/internal/errdefs"
)

// ErrorCodes, as E2B sends them.
const (
	NoCompatibleNode = "sandbox_no_compatible_node"
	Capacity         = "sandbox_capacity_unavailable"
)

// Node is one node as placement sees it.
type Node struct {
	Name     string
	Ready    bool // false: draining, or not heard from
	Features []string
	// Free capacity.
	FreeMemoryMB int
	FreeSlots    int
	FreeDiskMB   int
	// Templates lists the template builds the node holds locally.
	Templates []string
	// Load is how busy the node is, 0 (idle) to 1 (full); used to rank candidates.
	Load float64
}

// Request is what a sandbox needs.
type Request struct {
	Features []string
	MemoryMB int
	DiskMB   int
	// Template is the build the sandbox boots from (to prefer nodes that hold it).
	Template string
}

// Sample is how many candidates are ranked by load (E2B's orchestrator samples 3).
const Sample = 3

// Order returns the nodes to try for req, best first. No node with the features is a 503 with
// NoCompatibleNode; nodes with them but none with room (or ready) is a 429 with Capacity.
func Order(nodes []Node, req Request, rng *rand.Rand) ([]Node, error) {
	if len(nodes) == 0 {
		return nil, errdefs.WithCode(errdefs.Unavailable("no node is in the cluster"), NoCompatibleNode)
	}
	var capable []Node
	for _, n := range nodes {
		if hasAll(n.Features, req.Features) {
			capable = append(capable, n)
		}
	}
	if len(capable) == 0 {
		return nil, errdefs.WithCode(errdefs.Unavailable("no node has the features this sandbox needs (%s)", list(req.Features)), NoCompatibleNode)
	}
	var fits []Node
	for _, n := range capable {
		if n.Ready && n.FreeSlots > 0 && n.FreeMemoryMB >= req.MemoryMB && n.FreeDiskMB >= req.DiskMB {
			fits = append(fits, n)
		}
	}
	if len(fits) == 0 {
		return nil, errdefs.WithCode(errdefs.ResourceExhausted("every node that can run this sandbox is full or draining"), Capacity)
	}
	local, remote := split(fits, req.Template)
	return append(rank(local, rng), rank(remote, rng)...), nil
}

func split(nodes []Node, template string) (local, remote []Node) {
	for _, n := range nodes {
		if template != "" && slices.Contains(n.Templates, template) {
			local = append(local, n)
		} else {
			remote = append(remote, n)
		}
	}
	return local, remote
}

// rank shuffles nodes, then orders each window of Sample by load: the first node tried is the
// least loaded of Sample random ones, and the rest follow so a retry still has somewhere to go.
func rank(nodes []Node, rng *rand.Rand) []Node {
	if rng == nil {
		rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	for i := 0; i < len(nodes); i += Sample {
		w := nodes[i:min(i+Sample, len(nodes))]
		slices.SortStableFunc(w, func(a, b Node) int { return cmp.Compare(a.Load, b.Load) })
	}
	return nodes
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	out := s[0]
	for _, x := range s[1:] {
		out += ", " + x
	}
	return out
}
