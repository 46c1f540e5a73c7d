package api

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/volumes"
)

// VolumeFiles is the content of volumes (*volumes.Dir).
type VolumeFiles interface {
	Stat(ctx context.Context, id, p string) (volumes.Entry, error)
	List(ctx context.Context, id, p string, depth int) ([]volumes.Entry, error)
	Mkdir(ctx context.Context, id, p string, a volumes.Attrs, force bool) (volumes.Entry, error)
	Chattr(ctx context.Context, id, p string, a volumes.Attrs) (volumes.Entry, error)
	Open(ctx context.Context, id, p string) (io.ReadCloser, int64, error)
	Write(ctx context.Context, id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error)
	Remove(ctx context.Context, id, p string) error
}

type volumeJSON struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    string  `json:"token,omitempty"`
	Domain   *string `json:"domain,omitempty"`
	// SizeMB is vmon's own: the volume's size limit (absent for a volume without one, made by
	// an older vmon). E2B's Volume has no size; its SDKs ignore the extra field.
	SizeMB int `json:"sizeMB,omitempty"`
}

func (s *Server) volumeJSON(v driver.Volume, withToken bool) volumeJSON {
	out := volumeJSON{VolumeID: v.ID, Name: v.Name, Domain: s.domain, SizeMB: v.SizeMB}
	if withToken {
		out.Token = v.Token
	}
	return out
}

func (s *Server) volumeRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		"POST /volumes": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			var body struct {
				Name string `json:"name"`
				// SizeMB is vmon's addition to E2B's NewVolume (which has only a name): the
				// volume's size in MiB; omitted, the node's --volume-size-mb.
				SizeMB *int `json:"sizeMB"`
			}
			if err := decodeBody(r, &body, true); err != nil {
				return err
			}
			size := 0
			if body.SizeMB != nil {
				if *body.SizeMB <= 0 {
					return errdefs.InvalidArgument("sizeMB must be a positive number of MiB, got %d", *body.SizeMB)
				}
				size = *body.SizeMB
			}
			v, err := s.driver.CreateVolume(r.Context(), body.Name, size)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, s.volumeJSON(v, true))
			return nil
		}),
		"GET /volumes": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			vs, err := s.driver.ListVolumes(r.Context())
			if err != nil {
				return err
			}
			out := make([]volumeJSON, 0, len(vs))
			for _, v := range vs {
				out = append(out, s.volumeJSON(v, false))
			}
			writeJSON(w, http.StatusOK, out)
			return nil
		}),
		"GET /volumes/{id}": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			v, err := s.driver.GetVolume(r.Context(), r.PathValue("id"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, s.volumeJSON(v, true))
			return nil
		}),
		"DELETE /volumes/{id}": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			if err := s.driver.DeleteVolume(r.Context(), r.PathValue("id")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}),
	}
}

// volumeContentRoutes are E2B's volume content API. They authenticate with the volume's own token
// (Authorization: Bearer), not an API key.
func (s *Server) volumeContentRoutes(files VolumeFiles) map[string]http.Handler {
	h := func(f func(w http.ResponseWriter, r *http.Request, id, p string) error) http.Handler {
		return s.handle(func(w http.ResponseWriter, r *http.Request) error {
			id := r.PathValue("id")
			token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if err := s.driver.CheckVolumeToken(r.Context(), id, strings.TrimSpace(token)); err != nil {
				return err
			}
			q := r.URL.Query()
			if !q.Has("path") {
				return errdefs.InvalidArgument("path is required")
			}
			return f(w, r, id, q.Get("path"))
		})
	}
	return map[string]http.Handler{
		"GET /volumecontent/{id}/dir": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			depth := 1
			if v := r.URL.Query().Get("depth"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					return errdefs.InvalidArgument("depth must be an integer, got %s", errdefs.Quote(v))
				}
				depth = n
			}
			ents, err := files.List(r.Context(), id, p, depth)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, ents)
			return nil
		}),
		"POST /volumecontent/{id}/dir": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			a, force, err := attrsQuery(r)
			if err != nil {
				return err
			}
			e, err := files.Mkdir(r.Context(), id, p, a, force)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, e)
			return nil
		}),
		"GET /volumecontent/{id}/path": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			e, err := files.Stat(r.Context(), id, p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
			return nil
		}),
		"PATCH /volumecontent/{id}/path": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			var body struct {
				UID  *uint32 `json:"uid"`
				GID  *uint32 `json:"gid"`
				Mode *uint32 `json:"mode"`
			}
			if err := decodeBody(r, &body, true); err != nil {
				return err
			}
			e, err := files.Chattr(r.Context(), id, p, volumes.Attrs{UID: body.UID, GID: body.GID, Mode: body.Mode})
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
			return nil
		}),
		"DELETE /volumecontent/{id}/path": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			if err := files.Remove(r.Context(), id, p); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}),
		"GET /volumecontent/{id}/file": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			f, size, err := files.Open(r.Context(), id, p)
			if err != nil {
				return err
			}
			defer f.Close()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			w.WriteHeader(http.StatusOK)
			_, _ = io.Copy(w, io.LimitReader(f, size))
			return nil
		}),
		"PUT /volumecontent/{id}/file": h(func(w http.ResponseWriter, r *http.Request, id, p string) error {
			a, force, err := attrsQuery(r)
			if err != nil {
				return err
			}
			e, err := files.Write(r.Context(), id, p, r.Body, a, force)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
			return nil
		}),
	}
}

// attrsQuery reads uid, gid, mode (octal or decimal as the SDK sends numbers) and force.
func attrsQuery(r *http.Request) (volumes.Attrs, bool, error) {
	q := r.URL.Query()
	var a volumes.Attrs
	num := func(name string) (*uint32, error) {
		v := q.Get(name)
		if v == "" {
			return nil, nil
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, errdefs.InvalidArgument("%s must be a non-negative integer, got %s", name, errdefs.Quote(v))
		}
		u := uint32(n)
		return &u, nil
	}
	var err error
	if a.UID, err = num("uid"); err != nil {
		return a, false, err
	}
	if a.GID, err = num("gid"); err != nil {
		return a, false, err
	}
	if a.Mode, err = num("mode"); err != nil {
		return a, false, err
	}
	force := false
	if v := q.Get("force"); v != "" {
		if force, err = strconv.ParseBool(v); err != nil {
			return a, false, errdefs.InvalidArgument("force must be true or false, got %s", errdefs.Quote(v))
		}
	}
	return a, force, nil
}
