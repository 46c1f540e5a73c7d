package cluster

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/template"
)

// buildingNode runs builds by recording them, keeping files with the real build.Files.
type buildingNode struct {
	name  string
	files *build.Files
	dir   string

	mu     sync.Mutex
	builds []string
}

func (b *buildingNode) PutFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error {
	return b.files.Put(ctx, templateID, hash, r, size)
}

func (b *buildingNode) LogPath(buildID string) string { return filepath.Join(b.dir, buildID+".jsonl") }

func (b *buildingNode) Build(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	b.mu.Lock()
	b.builds = append(b.builds, req.BuildID)
	b.mu.Unlock()
	for _, s := range req.Steps {
		if ok, err := b.files.Has(ctx, req.TemplateID, s.FilesHash); s.FilesHash != "" && (err != nil || !ok) {
			return template.Manifest{}, &build.StepError{Step: "1", Msg: "archive missing"}
		}
	}
	log.Add("info", "1", "built on %s", b.name)
	return template.Manifest{ID: req.TemplateID, BuildID: req.BuildID, DefaultUser: "user"}, nil
}

// A build goes to the node that holds its parent template, with the COPY archives its steps
// name; a node that cannot be reached passes it to the next; no node at all fails the build at
// its base step, as the SDK shows it.
func TestBuildsRunOnANode(t *testing.T) {
	ctx := context.Background()
	driverFiles := build.NewFiles(t.TempDir())
	hash := strings.Repeat("e", 64)
	if err := driverFiles.Put(ctx, "tpl", hash, strings.NewReader("archive"), 7); err != nil {
		t.Fatal(err)
	}
	r := NewRouter(func(context.Context, string) (string, error) { return "", nil })
	nodes := map[string]*buildingNode{}
	servers := map[string]*httptest.Server{}
	for _, name := range []string{"node-a", "node-b"} {
		bn := &buildingNode{name: name, files: build.NewFiles(t.TempDir()), dir: t.TempDir()}
		held := []string{"other"}
		if name == "node-b" {
			held = []string{"base"}
		}
		mux := http.NewServeMux()
		mux.Handle(nodeapi.NewServer(drivertest.NewNode(), func() nodeapi.Status {
			return nodeapi.Status{FreeMemoryMB: 8192, FreeDiskMB: 1 << 20, FreeSlots: 10, Templates: held}
		}).WithBuilds(bn).Handler())
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		nodes[name], servers[name] = bn, ts
		r.Upsert(name, membership.Meta{Role: membership.RoleNode, State: membership.StateReady}, nodeapi.NewClient(ts.Client(), ts.URL))
	}
	r.Refresh(ctx)
	b := NewBuilds(r, driverFiles)
	req := func(id string) build.Request {
		return build.Request{TemplateID: "tpl", BuildID: id, FromTemplate: &build.Parent{TemplateID: "base", BuildID: "x"},
			Steps: []build.Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hash}}}
	}
	log, _ := build.NewLog(filepath.Join(t.TempDir(), "l1"))
	if _, err := b.Run(ctx, req("b1"), log); err != nil {
		t.Fatal(err)
	}
	if got := nodes["node-b"].builds; len(got) != 1 || len(nodes["node-a"].builds) != 0 {
		t.Fatalf("builds: node-a %v, node-b %v; want the one on node-b, which holds base", nodes["node-a"].builds, got)
	}
	if es := log.Since(0, 10); len(es) != 2 || es[0].Message != "building on node node-b" || es[1].Message != "built on node-b" {
		t.Fatalf("log: %+v", es)
	}

	// node-b stops answering (gossip has not noticed yet): the build goes to node-a, archive too.
	servers["node-b"].Close()
	log2, _ := build.NewLog(filepath.Join(t.TempDir(), "l2"))
	if _, err := b.Run(ctx, req("b2"), log2); err != nil {
		t.Fatal(err)
	}
	if got := nodes["node-a"].builds; len(got) != 1 || got[0] != "b2" {
		t.Fatalf("node-a's builds: %v", got)
	}

	// No node left: the build fails at its base step.
	servers["node-a"].Close()
	log3, _ := build.NewLog(filepath.Join(t.TempDir(), "l3"))
	_, err := b.Run(ctx, req("b3"), log3)
	se, ok := err.(*build.StepError)
	if !ok || se.Step != "base" || !strings.Contains(se.Msg, "no node can run the build") {
		t.Fatalf("with no node: %v", err)
	}
}
