package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
)

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// createSnapshot is POST /sandboxes/{id}/snapshots {name?}: 201 {snapshotID, names}.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	info, err := s.driver.CreateSnapshot(r.Context(), r.PathValue("id"), body.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotJSON{SnapshotID: info.SnapshotID, Names: info.Names})
	return nil
}

// listSnapshots is GET /snapshots?sandboxID&name&limit&nextToken, newest first, paged with
// X-Next-Token.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	o := driver.SnapshotListOptions{SandboxID: q.Get("sandboxID"), Name: q.Get("name"), NextToken: q.Get("nextToken")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > driver.MaxListLimit {
			return errdefs.InvalidArgument("limit must be an integer between 1 and %d, got %s", driver.MaxListLimit, errdefs.Quote(v))
		}
		o.Limit = n
	}
	infos, next, err := s.driver.ListSnapshots(r.Context(), o)
	if err != nil {
		return err
	}
	out := make([]snapshotJSON, 0, len(infos))
	for _, in := range infos {
		out = append(out, snapshotJSON{SnapshotID: in.SnapshotID, Names: in.Names})
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplateOrSnapshot is DELETE /templates/{id}: the SDK deletes snapshots through it.
// Anything that is not a snapshot goes to the template handler (when template builds are served).
func (s *Server) deleteTemplateOrSnapshot(templates http.Handler) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		err := s.driver.DeleteSnapshot(r.Context(), r.PathValue("id"))
		if (errdefs.Is(err, errdefs.KindNotFound) || errors.Is(err, driver.ErrNotImplemented)) && templates != nil {
			templates.ServeHTTP(w, r)
			return nil
		}
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// fork is POST /sandboxes/{id}/fork {count?, timeout?}: 201 with one entry per fork, each a
// sandbox or an error (code, message).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	timeout, err := optionalSeconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
		if count < 1 || count > driver.MaxForkCount {
			return errdefs.InvalidArgument("count must be between 1 and %d, got %d", driver.MaxForkCount, count)
		}
	}
	results, err := s.driver.Fork(r.Context(), r.PathValue("id"), count, timeout)
	if err != nil {
		return err
	}
	type entry struct {
		Sandbox *sandboxJSON `json:"sandbox,omitempty"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error,omitempty"`
	}
	out := make([]entry, len(results))
	for i, res := range results {
		if res.Sandbox != nil {
			sj := s.sandboxJSON(*res.Sandbox)
			out[i].Sandbox = &sj
			continue
		}
		out[i].Error = &struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}{Code: errdefs.HTTPStatus(res.Err), Message: errdefs.PublicMessage(res.Err)}
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
