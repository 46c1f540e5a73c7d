package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// How a sandbox's envd gets its agent channel (bootRecord.Channel, snapshot.Meta.Channel). It
// decides what a restore of the sandbox's checkpoint must give envd.
const (
	// channelDialled: envd dials a socket in a host directory bind mounted into the sandbox
	// (checkpoints taken by vmon before the control socket).
	channelDialled = ""
	// channelControl: envd got a control socket as a descriptor at start; a restore gives the
	// descriptor a new one (runtime.Spec.Files).
	channelControl = "control"
	// channelHandoff: envd's control socket was handed to it while it ran (after a node
	// restart), and such a one does not survive a restore: the node hands over a new one.
	channelHandoff = "handoff"
)

// parkWait bounds how long a pause or snapshot waits for envd to let go of its session.
const parkWait = 3 * time.Second

// guestEnvd is envd's path in the guest, under the mounted envd build.
func (n *Node) guestEnvd() string { return GuestBinDir + "/" + filepath.Base(n.opts.EnvdPath) }

// handoff gives the running envd of sandbox rid a new control socket, with the `envd handoff`
// helper of the envd build the sandbox runs, and returns the node's end.
func (n *Node) handoff(ctx context.Context, rid string) (*agentctl.Conn, error) {
	fe, ok := n.opts.Runtime.(runtime.FileExecer)
	if !ok {
		return nil, errdefs.Unavailable("this node's runtime cannot hand envd a new agent channel")
	}
	host, guest, err := agentctl.Pair()
	if err != nil {
		return nil, err
	}
	defer guest.Close()
	if out, err := fe.ExecFiles(ctx, rid, []*os.File{guest}, n.guestEnvd(), "handoff", "--fd", strconv.Itoa(runtime.FirstFile)); err != nil {
		host.Close()
		return nil, fmt.Errorf("hand envd a new control socket: %w: %s", err, out)
	}
	return host, nil
}

// park makes sb's envd let go of its agent session before a checkpoint (a checkpoint cannot
// keep it). A sandbox whose envd dials a socket needs nothing: a restore breaks that connection
// and envd redials.
func (n *Node) park(ctx context.Context, sb *sandbox, channel string) error {
	if channel == channelDialled || sb.ch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, parkWait)
	defer cancel()
	return sb.ch.Park(ctx)
}

// unpark gives sb's envd a session again after a park whose checkpoint did not happen.
func (n *Node) unpark(sb *sandbox, channel string) {
	if channel == channelDialled || sb.ch == nil {
		return
	}
	if err := sb.ch.Unpark(); err != nil {
		n.log.Warn("agent channel not resumed after a checkpoint that did not happen", "sandbox", sb.id, "err", err)
	}
}

// rebind gives the restored envd of sb, booted as rec says, its agent channel again: ctl, the
// control socket the restore passed, or one handed over.
func (n *Node) rebind(ctx context.Context, sb *sandbox, rec bootRecord, ctl *agentctl.Conn) error {
	switch rec.Channel {
	case channelControl:
		return sb.ch.Rebind(ctl)
	case channelHandoff:
		fresh, err := n.handoff(ctx, sb.runtimeID)
		if err != nil {
			return err
		}
		return sb.ch.Rebind(fresh)
	}
	return nil
}
