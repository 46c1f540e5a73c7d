package nodeapi

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
)

func specToWire(s node.CreateSpec) (*nodev1.CreateSpec, error) {
	pol, err := policyToWire(s.Egress)
	if err != nil {
		return nil, err
	}
	out := &nodev1.CreateSpec{
		Id: s.ID, TemplateId: s.TemplateID, BuildId: s.BuildID,
		Cpus: int32(s.CPUs), MemoryMb: int32(s.MemoryMB), DiskMb: int32(s.DiskMB),
		EnvVars: s.EnvVars, AccessToken: s.AccessToken, DefaultUser: s.DefaultUser,
		DefaultWorkdir: s.DefaultWorkdir, EgressPolicy: pol,
	}
	for _, v := range s.Volumes {
		out.Volumes = append(out.Volumes, &nodev1.VolumeMount{Id: v.ID, Path: v.Path})
	}
	return out, nil
}

func specFromWire(s *nodev1.CreateSpec) (node.CreateSpec, error) {
	if s == nil {
		return node.CreateSpec{}, errdefs.InvalidArgument("spec is required")
	}
	p, err := policyFromWire(s.GetEgressPolicy())
	if err != nil {
		return node.CreateSpec{}, err
	}
	out := node.CreateSpec{
		ID: s.GetId(), TemplateID: s.GetTemplateId(), BuildID: s.GetBuildId(),
		CPUs: int(s.GetCpus()), MemoryMB: int(s.GetMemoryMb()), DiskMB: int(s.GetDiskMb()),
		EnvVars: s.GetEnvVars(), AccessToken: s.GetAccessToken(), DefaultUser: s.GetDefaultUser(),
		DefaultWorkdir: s.GetDefaultWorkdir(), Egress: p,
	}
	for _, v := range s.GetVolumes() {
		out.Volumes = append(out.Volumes, node.VolumeMount{ID: v.GetId(), Path: v.GetPath()})
	}
	return out, nil
}

func policyToWire(p egress.Policy) ([]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode egress policy: %w", err)
	}
	return b, nil
}

func policyFromWire(b []byte) (egress.Policy, error) {
	var p egress.Policy
	if len(b) == 0 {
		return p, nil
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, errdefs.InvalidArgument("invalid egress policy: %v", err)
	}
	return p, nil
}

func infoToWire(i node.Info) *nodev1.SandboxInfo {
	return &nodev1.SandboxInfo{Id: i.ID, StartedAt: stamp(i.StartedAt), EnvdVersion: i.EnvdVersion}
}

func infoFromWire(i *nodev1.SandboxInfo) node.Info {
	return node.Info{ID: i.GetId(), StartedAt: unstamp(i.GetStartedAt()), EnvdVersion: i.GetEnvdVersion()}
}

func metricsToWire(m node.Metrics) *nodev1.Metrics {
	return &nodev1.Metrics{Timestamp: stamp(m.Timestamp), CpuCount: int32(m.CPUCount), CpuUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}

func metricsFromWire(m *nodev1.Metrics) node.Metrics {
	return node.Metrics{Timestamp: unstamp(m.GetTimestamp()), CPUCount: int(m.GetCpuCount()), CPUUsedPct: m.GetCpuUsedPct(),
		MemUsed: m.GetMemUsed(), MemTotal: m.GetMemTotal(), MemCache: m.GetMemCache(), DiskUsed: m.GetDiskUsed(), DiskTotal: m.GetDiskTotal()}
}

func deniedToWire(e node.DeniedEvent) *nodev1.DeniedEvent {
	return &nodev1.DeniedEvent{Time: stamp(e.Time), SandboxId: e.SandboxID, Proto: e.Proto, Dst: e.Dst,
		Port: uint32(e.Port), Name: e.Name, Stage: e.Stage, Rule: e.Rule, Count: int64(e.Count), Repeats: e.Repeats}
}

func deniedFromWire(e *nodev1.DeniedEvent) node.DeniedEvent {
	return node.DeniedEvent{Time: unstamp(e.GetTime()), SandboxID: e.GetSandboxId(), Proto: e.GetProto(), Dst: e.GetDst(),
		Port: uint16(e.GetPort()), Name: e.GetName(), Stage: e.GetStage(), Rule: e.GetRule(), Count: int(e.GetCount()), Repeats: e.GetRepeats()}
}

// stamp keeps a zero time zero across the wire (a zero Timestamp is 1970, not Go's zero).
func stamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func unstamp(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
