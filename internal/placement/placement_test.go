package placement

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

func node(name string, load float64, features ...string) Node {
	return Node{Name: name, Ready: true, Features: features, FreeMemoryMB: 4096, FreeSlots: 10, FreeDiskMB: 10240, Load: load}
}

func names(ns []Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out
}

func TestFilters(t *testing.T) {
	full := node("full", 0.1, "net-tap")
	full.FreeSlots = 0
	small := node("small", 0.1, "net-tap")
	small.FreeMemoryMB = 256
	nodisk := node("nodisk", 0.1, "net-tap")
	nodisk.FreeDiskMB = 100
	draining := node("draining", 0, "net-tap", "egress-domains")
	draining.Ready = false
	for _, c := range []struct {
		name  string
		nodes []Node
		req   Request
		want  []string
		code  string
		kind  errdefs.Kind
	}{
		{"no nodes", nil, Request{}, nil, NoCompatibleNode, errdefs.KindUnavailable},
		{"features", []Node{node("a", 0, "net-tap"), node("b", 0, "net-tap", "egress-domains")},
			Request{Features: []string{"net-tap", "egress-domains"}, MemoryMB: 512}, []string{"b"}, "", 0},
		{"no node has a feature", []Node{node("a", 0, "net-tap")},
			Request{Features: []string{"egress-proxy"}}, nil, NoCompatibleNode, errdefs.KindUnavailable},
		{"capacity and state", []Node{full, small, nodisk, draining, node("ok", 0.9, "net-tap")},
			Request{Features: []string{"net-tap"}, MemoryMB: 512, DiskMB: 1024}, []string{"ok"}, "", 0},
		{"every capable node full", []Node{full, draining, node("other", 0, "net-user")},
			Request{Features: []string{"net-tap"}, MemoryMB: 512}, nil, Capacity, errdefs.KindResourceExhausted},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Order(c.nodes, c.req, rand.New(rand.NewPCG(1, 2)))
			if c.code != "" {
				var e *errdefs.Error
				if err == nil || errdefs.KindOf(err) != c.kind || !errors.As(err, &e) || e.Code != c.code {
					t.Fatalf("got %v %v, want %s", names(got), err, c.code)
				}
				return
			}
			if err != nil || len(got) != len(c.want) {
				t.Fatalf("got %v %v, want %v", names(got), err, c.want)
			}
			for i := range got {
				if got[i].Name != c.want[i] {
					t.Fatalf("got %v, want %v", names(got), c.want)
				}
			}
		})
	}
}

func TestTemplateHoldersFirstThenLeastLoadedOfASample(t *testing.T) {
	var nodes []Node
	for i, load := range []float64{0.9, 0.1, 0.5, 0.3, 0.7, 0.2} {
		n := node(string(rune('a'+i)), load, "net-tap")
		if i == 0 || i == 4 {
			n.Templates = []string{"tpl"}
		}
		nodes = append(nodes, n)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for round := 0; round < 50; round++ {
		got, err := Order(append([]Node(nil), nodes...), Request{Template: "tpl", MemoryMB: 512}, rng)
		if err != nil || len(got) != 6 {
			t.Fatal(names(got), err)
		}
		// The two holders come first, the less loaded of them first.
		if got[0].Name != "e" || got[1].Name != "a" {
			t.Fatalf("holders not first: %v", names(got))
		}
		// Each window of Sample among the others is ordered by load.
		rest := got[2:]
		for i := 0; i < len(rest); i += Sample {
			w := rest[i:min(i+Sample, len(rest))]
			for j := 1; j < len(w); j++ {
				if w[j].Load < w[j-1].Load {
					t.Fatalf("window not by load: %v", names(rest))
				}
			}
		}
	}
}

func TestSpreadsAcrossEqualNodes(t *testing.T) {
	nodes := []Node{node("a", 0.2, "net-tap"), node("b", 0.2, "net-tap"), node("c", 0.2, "net-tap")}
	first := map[string]int{}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 300; i++ {
		got, err := Order(append([]Node(nil), nodes...), Request{MemoryMB: 512}, rng)
		if err != nil {
			t.Fatal(err)
		}
		first[got[0].Name]++
	}
	for _, n := range []string{"a", "b", "c"} {
		if first[n] < 60 {
			t.Fatalf("equal nodes picked first %v times of 300", first)
		}
	}
}

func BenchmarkOrder1000Nodes(b *testing.B) {
	var nodes []Node
	for i := 0; i < 1000; i++ {
		n := node("n", float64(i%100)/100, "net-tap", "egress-domains")
		if i%10 == 0 {
			n.Templates = []string{"tpl"}
		}
		nodes = append(nodes, n)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	req := Request{Features: []string{"net-tap"}, MemoryMB: 512, Template: "tpl"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Order(nodes, req, rng); err != nil {
			b.Fatal(err)
		}
	}
}
