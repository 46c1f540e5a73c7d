package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// deniedHeartbeat keeps idle streams open through proxies that close silent connections.
const deniedHeartbeat = 15 * time.Second

// watchDenied is GET /sandboxes/{id}/network/denied: the sandbox's refusals as server-sent events
// (`event: denied`, one JSON object per event), the recent ones first, then as they happen.
// ?follow=false ends the stream after the recent ones.
func (s *Server) watchDenied(w http.ResponseWriter, r *http.Request) error {
	backlog, ch, cancel, err := s.driver.WatchDenied(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	defer cancel()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: denied\ndata: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	for _, e := range backlog {
		if err := send(e); err != nil {
			return nil
		}
	}
	if r.URL.Query().Get("follow") == "false" {
		return nil
	}
	if err := rc.Flush(); err != nil {
		return nil
	}
	// A stream outlives any server write deadline.
	_ = rc.SetWriteDeadline(time.Time{})
	tick := time.NewTicker(deniedHeartbeat)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case e := <-ch:
			if err := send(e); err != nil {
				return nil
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return nil
			}
		}
	}
}
