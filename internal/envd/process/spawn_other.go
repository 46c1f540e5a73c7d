//go:build !linux

package process

import (
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

type spec struct {
	user  *users.User
	path  string
	args  []string
	env   []string
	dir   string
	pty   *pb.PTY
	stdin bool
}

func spawn(spec, *pb.ProcessConfig, *string, Starter) (*proc, error) {
	return nil, errdefs.Unavailable("starting processes is only supported on linux")
}

func (p *proc) resize(*pb.PTY_Size) error {
	return errdefs.Unavailable("PTYs are only supported on linux")
}
