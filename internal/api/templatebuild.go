package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/templates"
)

// TemplateBuilds is the template build flow (*templates.Service).
type TemplateBuilds interface {
	Create(ctx context.Context, req templates.CreateRequest) (templates.Created, error)
	FileStatus(ctx context.Context, templateID, hash string) (bool, string, error)
	Upload(ctx context.Context, templateID, hash, token string, r io.Reader, size int64) error
	StartBuild(ctx context.Context, templateID, buildID string, spec templates.StartSpec) error
	Status(ctx context.Context, templateID, buildID string, offset int) (templates.Status, error)
	Delete(ctx context.Context, ref string) error
	AssignTags(ctx context.Context, target string, tags []string) (string, []string, error)
	RemoveTags(ctx context.Context, name string, tags []string) error
	Tags(ctx context.Context, ref string) ([]store.Tag, error)
}

// DefaultMaxUploadBytes caps one COPY archive upload.
const DefaultMaxUploadBytes = 10 << 30

func (s *Server) templateBuildRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		"POST /v3/templates":                      s.handle(s.createTemplate),
		"POST /v2/templates":                      s.handle(s.createTemplate),
		"POST /v2/templates/{id}/builds/{bid}":    s.handle(s.startBuild),
		"GET /templates/{id}/builds/{bid}/status": s.handle(s.buildStatus),
		"GET /templates/{id}/files/{hash}":        s.handle(s.fileStatus),
		"DELETE /templates/{id}":                  s.handle(s.deleteTemplate),
		"POST /templates/tags":                    s.handle(s.assignTags),
		"DELETE /templates/tags":                  s.handle(s.removeTags),
		// "{id}/tags" would overlap "aliases/{alias}"; this pattern is strictly more general.
		"GET /templates/{id}/{sub}": s.handle(s.templateSub),
	}
}

// uploadRoute takes COPY archives. It is outside API-key authentication: the SDK PUTs to the URL
// fileStatus handed out, whose token is the credential.
const uploadRoute = "PUT /templates/{id}/files/{hash}"

func isUpload(r *http.Request) bool {
	return r.Method == http.MethodPut && (strings.HasPrefix(r.URL.Path, "/templates/") && strings.Contains(r.URL.Path, "/files/") ||
		strings.HasPrefix(r.URL.Path, "/volumecontent/"))
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name          string   `json:"name"`
		Alias         string   `json:"alias"` // v2 spelling
		Tags          []string `json:"tags"`
		CPUCount      *int     `json:"cpuCount"`
		MemoryMB      *int     `json:"memoryMB"`
		MinFreeDiskMB *int     `json:"minFreeDiskMb"`
	}
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if body.Name == "" {
		body.Name = body.Alias
	}
	if body.Name == "" {
		return errdefs.InvalidArgument("name is required")
	}
	req := templates.CreateRequest{Name: body.Name, Tags: body.Tags}
	if body.CPUCount != nil {
		if *body.CPUCount <= 0 {
			return errdefs.InvalidArgument("cpuCount must be positive")
		}
		req.CPUs = *body.CPUCount
	}
	if body.MemoryMB != nil {
		if *body.MemoryMB <= 0 {
			return errdefs.InvalidArgument("memoryMB must be positive")
		}
		req.MemoryMB = *body.MemoryMB
	}
	c, err := s.builds.Create(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": c.TemplateID, "buildID": c.BuildID, "names": c.Names, "tags": c.Tags,
		"aliases": c.Aliases, "public": false,
	})
	return nil
}

func (s *Server) fileStatus(w http.ResponseWriter, r *http.Request) error {
	id, hash := r.PathValue("id"), r.PathValue("hash")
	present, token, err := s.builds.FileStatus(r.Context(), id, hash)
	if err != nil {
		return err
	}
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: "/templates/" + url.PathEscape(id) + "/files/" + url.PathEscape(hash),
		RawQuery: url.Values{"token": {token}}.Encode()}
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": u.String()})
	return nil
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength < 0 {
		return &httpError{status: http.StatusLengthRequired, msg: "uploads need a Content-Length"}
	}
	if r.ContentLength > s.maxUpload {
		return &httpError{status: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("upload of %d bytes exceeds the limit of %d bytes", r.ContentLength, s.maxUpload)}
	}
	err := s.builds.Upload(r.Context(), r.PathValue("id"), r.PathValue("hash"), r.URL.Query().Get("token"), r.Body, r.ContentLength)
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// buildStartJSON is E2B's TemplateBuildStartV2.
type buildStartJSON struct {
	FromImage         *string             `json:"fromImage"`
	FromTemplate      *string             `json:"fromTemplate"`
	FromImageRegistry *templates.Registry `json:"fromImageRegistry"`
	StartCmd          *string             `json:"startCmd"`
	ReadyCmd          *string             `json:"readyCmd"`
	Force             bool                `json:"force"`
	Steps             []templates.Step    `json:"steps"`
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) error {
	var body buildStartJSON
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	err := s.builds.StartBuild(r.Context(), r.PathValue("id"), r.PathValue("bid"), templates.StartSpec{
		FromImage: deref(body.FromImage), FromTemplate: deref(body.FromTemplate), FromImageRegistry: body.FromImageRegistry,
		StartCmd: deref(body.StartCmd), ReadyCmd: deref(body.ReadyCmd), Force: body.Force, Steps: body.Steps,
	})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
	return nil
}

type buildLogEntryJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) error {
	offset := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errdefs.InvalidArgument("logsOffset must be a non-negative integer")
		}
		offset = n
	}
	st, err := s.builds.Status(r.Context(), r.PathValue("id"), r.PathValue("bid"), offset)
	if err != nil {
		return err
	}
	entries := make([]buildLogEntryJSON, 0, len(st.Entries))
	logs := make([]string, 0, len(st.Entries))
	for _, e := range st.Entries {
		entries = append(entries, buildLogEntryJSON(e))
		logs = append(logs, fmt.Sprintf("[%s] %s", e.Timestamp.Format(time.RFC3339), e.Message))
	}
	out := map[string]any{
		"buildID": st.Build.ID, "templateID": st.Build.TemplateID, "status": string(st.Build.Status),
		"logEntries": entries, "logs": logs,
	}
	if st.Build.Status == store.TemplateError {
		reason := map[string]any{"message": st.Build.ReasonMessage}
		if st.Build.ReasonStep != "" {
			reason["step"] = st.Build.ReasonStep
		}
		out["reason"] = reason
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.builds.Delete(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if body.Target == "" {
		return errdefs.InvalidArgument("target is required")
	}
	bid, tags, err := s.builds.AssignTags(r.Context(), body.Target, body.Tags)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": bid, "tags": tags})
	return nil
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if body.Name == "" {
		return errdefs.InvalidArgument("name is required")
	}
	if err := s.builds.RemoveTags(r.Context(), body.Name, body.Tags); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) templateSub(w http.ResponseWriter, r *http.Request) error {
	if r.PathValue("sub") != "tags" {
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)}
	}
	return s.listTags(w, r)
}

func (s *Server) listTags(w http.ResponseWriter, r *http.Request) error {
	tags, err := s.builds.Tags(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(tags))
	for _, t := range tags {
		out = append(out, map[string]any{"tag": t.Tag, "buildID": t.BuildID, "createdAt": t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
