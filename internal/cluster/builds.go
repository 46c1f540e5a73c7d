package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/template"
)

// BuildNode is the part of a node client that runs template builds (nodeapi.Client).
type BuildNode interface {
	PutBuildFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error
	BuildTemplate(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error)
}

// BuildFiles are the COPY archives the SDK uploaded to the driver (*build.Files).
type BuildFiles interface {
	Open(ctx context.Context, templateID, hash string) (*os.File, error)
}

// Builds runs template builds on the cluster's nodes: it is the build engine of a driver's
// template service. A build goes to a ready node placement orders first (one holding the parent
// template preferred), with the COPY archives it needs; the node publishes the result to the
// cluster's store, from where every node fetches it when a sandbox of it lands there.
type Builds struct {
	r     *Router
	files BuildFiles
}

// NewBuilds runs builds on r's nodes with the archives in files.
func NewBuilds(r *Router, files BuildFiles) *Builds { return &Builds{r: r, files: files} }

// Run runs req on one node. A node that cannot be reached before the build starts passes it to
// the next; one that fails mid-build fails the build (its steps may have run).
func (b *Builds) Run(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	spec := node.CreateSpec{MemoryMB: req.MemoryMB}
	if req.FromTemplate != nil {
		spec.TemplateID = req.FromTemplate.TemplateID
	}
	order, clients, err := b.r.candidates(spec, nil, "")
	if err != nil {
		return template.Manifest{}, &build.StepError{Step: "base", Msg: "no node can run the build: " + errdefs.PublicMessage(err), Cause: err}
	}
	var lastErr error
	for _, n := range order {
		bn, ok := clients[n.Name].(BuildNode)
		if !ok {
			continue
		}
		log.Add("info", "", "building on node %s", n.Name)
		started := log.Len()
		if err := b.sendFiles(ctx, bn, req); err != nil {
			if errdefs.KindOf(err) == errdefs.KindUnavailable {
				lastErr = err
				continue
			}
			return template.Manifest{}, &build.StepError{Step: "base", Msg: "cannot hand the build's files to its node: " + errdefs.PublicMessage(err), Cause: err}
		}
		m, err := bn.BuildTemplate(ctx, req, log)
		var se *build.StepError
		switch {
		case err == nil || errors.As(err, &se):
			return m, err
		case errdefs.KindOf(err) == errdefs.KindUnavailable && log.Len() == started:
			lastErr = err // the node never began it
			continue
		}
		return template.Manifest{}, &build.StepError{Msg: fmt.Sprintf("node %s: %s", n.Name, errdefs.PublicMessage(err)), Cause: err}
	}
	if lastErr == nil {
		lastErr = errdefs.Unavailable("no ready node runs template builds")
	}
	return template.Manifest{}, &build.StepError{Step: "base", Msg: "no node can run the build: " + errdefs.PublicMessage(lastErr), Cause: lastErr}
}

// sendFiles hands the node every archive req's COPY steps name.
func (b *Builds) sendFiles(ctx context.Context, bn BuildNode, req build.Request) error {
	sent := map[string]bool{}
	for _, s := range req.Steps {
		if s.FilesHash == "" || sent[s.FilesHash] {
			continue
		}
		sent[s.FilesHash] = true
		if err := b.sendFile(ctx, bn, req.TemplateID, s.FilesHash); err != nil {
			return err
		}
	}
	return nil
}

func (b *Builds) sendFile(ctx context.Context, bn BuildNode, templateID, hash string) error {
	f, err := b.files.Open(ctx, templateID, hash)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return bn.PutBuildFile(ctx, templateID, hash, f, fi.Size())
}

var _ BuildNode = (*nodeapi.Client)(nil)
