package node

import "time"

// CreateSpec is what the driver asks a node to boot.
type CreateSpec struct {
	ID string
	// TemplateID names a ready template on this node (its rootfs lives under the data dir).
	TemplateID string
	CPUs       int
	MemoryMB   int
	// Delivered to envd through /init before Create returns.
	EnvVars        map[string]string
	AccessToken    string
	DefaultUser    string
	DefaultWorkdir string
}

// Info describes a sandbox the node runs.
type Info struct {
	ID          string
	StartedAt   time.Time
	EnvdVersion string
}
