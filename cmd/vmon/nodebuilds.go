package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/tplstore"
)

// nodeBuilds runs the template builds a driver hands this node (nodeapi.Builder): the driver keeps
// the records and the log; the node resolves the parent (fetching it when it lacks it), runs the
// steps in its build sandboxes and publishes the result to the cluster's store, so that a
// sandbox of it can boot on any node.
type nodeBuilds struct {
	dataDir string
	engine  *build.Engine
	files   *build.Files
	tpls    *tplstore.Sync
	// checkStart refuses a start command this node cannot run (as --role all's service does).
	checkStart func(startCmd string) error
}

func (b nodeBuilds) PutFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error {
	return b.files.Put(ctx, templateID, hash, r, size)
}

func (b nodeBuilds) LogPath(buildID string) string {
	if !template.ValidBuildID(buildID) {
		buildID = "invalid-build-id"
	}
	return filepath.Join(b.dataDir, "build-logs", buildID+".jsonl")
}

func (b nodeBuilds) Build(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	if !template.ValidBuildID(req.BuildID) {
		return template.Manifest{}, errdefs.InvalidArgument("invalid build id %q", req.BuildID)
	}
	if req.StartCmd != "" && b.checkStart != nil {
		if err := b.checkStart(req.StartCmd); err != nil {
			return template.Manifest{}, &build.StepError{Step: "finalize", Msg: errdefs.PublicMessage(err), Cause: err}
		}
	}
	if p := req.FromTemplate; p != nil && len(p.Layers) == 0 {
		if _, err := loadOrFetch(ctx, b.dataDir, b.tpls.Fetch, p.TemplateID, p.BuildID); err != nil {
			return template.Manifest{}, &build.StepError{Step: "base", Msg: fmt.Sprintf("cannot get template %s", p.TemplateID), Cause: err}
		}
		parent, err := build.ResolveParent(b.dataDir, p.TemplateID, p.BuildID)
		if err != nil {
			return template.Manifest{}, &build.StepError{Step: "base", Msg: fmt.Sprintf("cannot read template %s", p.TemplateID), Cause: err}
		}
		req.FromTemplate = parent
	}
	m, err := b.engine.Run(ctx, req, log)
	if err != nil {
		return m, err
	}
	log.Add("info", "finalize", "publishing the build to the cluster's store")
	if err := b.tpls.PublishBuild(ctx, m); err != nil {
		return template.Manifest{}, &build.StepError{Step: "finalize", Msg: "cannot publish the build to the cluster's store", Cause: err}
	}
	return m, nil
}
