package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
)

// secretJSON is E2B's Secret: metadata only, never the value.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	Metadata       map[string]string `json:"metadata"`
	CurrentVersion int64             `json:"currentVersion"`
	CreatedAt      string            `json:"createdAt"`
	UpdatedAt      string            `json:"updatedAt"`
}

func toSecretJSON(s driver.SecretInfo) secretJSON {
	m := s.Metadata
	if m == nil {
		m = map[string]string{}
	}
	return secretJSON{SecretID: s.ID, Name: s.Name, Metadata: m, CurrentVersion: s.Version,
		CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano), UpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano)}
}

// secretBody is POST /secrets and POST /secrets/{id}. Value is a pointer so a missing one is told
// apart from an empty one.
type secretBody struct {
	Name     string            `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

func (s *Server) secretRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET /secrets": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			q := r.URL.Query()
			limit := 0
			if v := q.Get("limit"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 || n > driver.MaxListLimit {
					return errdefs.InvalidArgument("limit must be an integer between 1 and %d, got %s", driver.MaxListLimit, errdefs.Quote(v))
				}
				limit = n
			}
			secs, next, err := s.driver.ListSecrets(r.Context(), limit, q.Get("nextToken"))
			if err != nil {
				return err
			}
			out := make([]secretJSON, 0, len(secs))
			for _, sec := range secs {
				out = append(out, toSecretJSON(sec))
			}
			if next != "" {
				w.Header().Set("X-Next-Token", next)
			}
			writeJSON(w, http.StatusOK, out)
			return nil
		}),
		"POST /secrets": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			var body secretBody
			if err := decodeBody(r, &body, true); err != nil {
				return err
			}
			if body.Value == nil {
				return errdefs.InvalidArgument("value is required")
			}
			sec, err := s.driver.CreateSecret(r.Context(), body.Name, *body.Value, body.Metadata)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, toSecretJSON(sec))
			return nil
		}),
		"GET /secrets/{id}": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			sec, err := s.driver.GetSecret(r.Context(), r.PathValue("id"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, toSecretJSON(sec))
			return nil
		}),
		"POST /secrets/{id}": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			var body secretBody
			if err := decodeBody(r, &body, true); err != nil {
				return err
			}
			if body.Value == nil {
				return errdefs.InvalidArgument("value is required")
			}
			sec, err := s.driver.UpdateSecret(r.Context(), r.PathValue("id"), *body.Value, body.Metadata)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, toSecretJSON(sec))
			return nil
		}),
		"DELETE /secrets/{id}": s.handle(func(w http.ResponseWriter, r *http.Request) error {
			if err := s.driver.DeleteSecret(r.Context(), r.PathValue("id")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}),
	}
}
