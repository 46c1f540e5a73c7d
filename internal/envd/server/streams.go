package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
)

// endStreamsWait bounds how long POST /vmon/end-streams waits for the streams to end: a client
// that reads slowly must not hold up a pause.
const endStreamsWait = 2 * time.Second

// endStreams ends every open process event stream with the reason the node gives (it is about
// to pause or snapshot the sandbox), so clients see why instead of a cut connection. It is
// vmon's own endpoint and needs the access token like every other.
func (s *Server) endStreams(w http.ResponseWriter, r *http.Request) {
	var req agentproto.EndStreamsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.writeError(w, r, errdefs.InvalidArgument("invalid end-streams body: %v", err))
		return
	}
	why, ok := streamEndReasons[req.Reason]
	if !ok {
		s.writeError(w, r, errdefs.InvalidArgument("unknown end-streams reason %q", req.Reason))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), endStreamsWait)
	defer cancel()
	if err := s.procs.EndStreams(ctx, func(pid uint32) error {
		return connect.NewError(connect.CodeAborted, errors.New(why(pid)))
	}); err != nil {
		s.log.Warn("process streams did not all end before the pause", "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// streamEndReasons are what a stream's client reads when the node ends it.
var streamEndReasons = map[string]func(pid uint32) string{
	agentproto.EndStreamsPause: func(pid uint32) string {
		return fmt.Sprintf("the sandbox was paused: process %d keeps its state; after resuming the sandbox, reconnect to it with commands.connect(%d)", pid, pid)
	},
	agentproto.EndStreamsPauseFiles: func(pid uint32) string {
		return fmt.Sprintf("the sandbox was paused without its memory: process %d ended with it", pid)
	},
	agentproto.EndStreamsSnapshot: func(pid uint32) string {
		return fmt.Sprintf("the sandbox is being snapshotted: process %d goes on; reconnect to it with commands.connect(%d)", pid, pid)
	},
}
