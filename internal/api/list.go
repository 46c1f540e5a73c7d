package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// listV1 is `GET /sandboxes`: every running sandbox, optional metadata filter, no paging.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) error {
	meta, err := parseMetadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	sbs, err := s.driver.ListRunning(r.Context(), meta)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, listed(sbs))
	return nil
}

// listV2 is `GET /v2/sandboxes` with filters and keyset paging (X-Next-Token).
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var (
		o   driver.ListOptions
		err error
	)
	if o.Metadata, err = parseMetadataQuery(q.Get("metadata")); err != nil {
		return err
	}
	// The SDK comma-joins arrays (state=running,paused); repeated parameters work too.
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch st = strings.TrimSpace(st); st {
			case "":
			case string(store.StateRunning), string(store.StatePaused):
				o.States = append(o.States, store.SandboxState(st))
			default:
				return errdefs.InvalidArgument("invalid state %q: expected running or paused", st)
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > driver.MaxListLimit {
			return errdefs.InvalidArgument("limit must be an integer between 1 and %d, got %q", driver.MaxListLimit, v)
		}
		o.Limit = n
	}
	switch v := q.Get("order"); v {
	case "", "desc":
	case "asc":
		o.Ascending = true
	default:
		return errdefs.InvalidArgument("order must be asc or desc, got %q", v)
	}
	if v := q.Get("startedAfter"); v != "" {
		if o.StartedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return errdefs.InvalidArgument("startedAfter must be an RFC 3339 time, got %q", v)
		}
	}
	o.Template = q.Get("template")
	o.NextToken = q.Get("nextToken")

	res, err := s.driver.List(r.Context(), o)
	if err != nil {
		return err
	}
	if res.NextToken != "" {
		w.Header().Set("X-Next-Token", res.NextToken)
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(res.TotalRunning))
	writeJSON(w, http.StatusOK, listed(res.Sandboxes))
	return nil
}

// parseMetadataQuery decodes the `metadata` filter as E2B's API does. The SDK URL-encodes each key
// and value, joins the pairs with URLSearchParams (which encodes '%' again), and the whole string
// is encoded once more as the parameter value: {"a b":"c&d"} arrives as
// `metadata=a%252520b%3Dc%252526d`. So: take the already-decoded parameter, unescape once more,
// split on '&' and '=', then unescape each key and value.
func parseMetadataQuery(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	joined, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, errdefs.InvalidArgument("invalid metadata filter encoding: %q", raw)
	}
	out := map[string]string{}
	for _, pair := range strings.Split(joined, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, errdefs.InvalidArgument("invalid metadata filter %q: expected key=value", pair)
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, errdefs.InvalidArgument("invalid metadata filter key encoding: %q", k)
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, errdefs.InvalidArgument("invalid metadata filter value encoding: %q", v)
		}
		out[key] = val
	}
	return out, nil
}
