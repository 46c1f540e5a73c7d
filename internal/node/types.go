package node

import (
	"time"

	"github.com/vibemon/vmon/internal/egress"
)

// CreateSpec is what the driver asks a node to boot.
type CreateSpec struct {
	ID string
	// TemplateID names a ready template on this node (its rootfs lives under the data dir).
	TemplateID string
	// BuildID picks one build of the template; empty means its current one.
	BuildID  string
	CPUs     int
	MemoryMB int
	// DiskMB caps what the sandbox can write (its writable layer's size); 0 means no cap.
	DiskMB int
	// Delivered to envd through /init before Create returns.
	EnvVars        map[string]string
	AccessToken    string
	DefaultUser    string
	DefaultWorkdir string
	// Egress is the validated egress policy, in force before the sandbox's first instruction.
	Egress egress.Policy
	// Volumes are mounted into the sandbox (validated by the driver).
	Volumes []VolumeMount
}

// VolumeMount mounts volume ID at Path in the guest.
type VolumeMount struct {
	ID   string
	Path string
}

// Info describes a sandbox the node runs.
type Info struct {
	ID          string
	StartedAt   time.Time
	EnvdVersion string
	// Node names the node that runs it, when the driver has several (set by whoever routed the
	// call there); "" is the driver's own.
	Node string
}
