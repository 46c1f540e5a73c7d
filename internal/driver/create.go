package driver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// CreateRequest is what a client asks for when creating a sandbox.
type CreateRequest struct {
	// Template is a template id, name, "name:tag" or "namespace/name[:tag]".
	Template string
	// Timeout is the time to live; nil means the default.
	Timeout  *time.Duration
	Metadata map[string]string
	EnvVars  map[string]string
	// Secure gives the sandbox an envd access token. v2 clients always get one; only v1 clients
	// can ask for an insecure sandbox.
	Secure bool
	// AllowInternetAccess false denies all egress except allowOut (E2B's allow_internet_access).
	AllowInternetAccess *bool
	Network             *Network
	// AutoPause (lifecycle onTimeout "pause") pauses the sandbox at expiry instead of killing it,
	// keeping its memory unless AutoPauseMemory is false; AutoResume resumes it when ingress gets
	// a request for it.
	AutoPause       bool
	AutoPauseMemory *bool
	AutoResume      bool
	// VolumeMounts name existing volumes (by name) and where they are mounted.
	VolumeMounts []VolumeMountRequest
}

// defaultUser runs commands when the template names none (E2B's base template user).
const defaultUser = "user"

// Create validates req, boots a sandbox on the node and returns its running record.
func (d *Driver) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	start := time.Now()
	sb, err := d.create(ctx, req)
	d.observe("create", sb.TemplateID, start, err)
	return sb, err
}

func (d *Driver) create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	timeout := d.opts.DefaultTimeout
	if req.Timeout != nil {
		timeout = *req.Timeout
		if err := d.checkTimeout("timeout", timeout); err != nil {
			return Sandbox{}, err
		}
	}
	if req.AutoResume && req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		return Sandbox{}, errdefs.InvalidArgument("autoResume cannot be enabled with autoPauseMemory false: a filesystem-only pause must be resumed explicitly with connect")
	}
	if req.AutoPause || req.AutoResume {
		if _, err := d.pauser(); err != nil {
			return Sandbox{}, fmt.Errorf("lifecycle onTimeout 'pause' and autoResume: %w", err)
		}
	}
	mounts, err := d.resolveMounts(ctx, req.VolumeMounts)
	if err != nil {
		return Sandbox{}, err
	}
	if err := validateEnvVars(req.EnvVars); err != nil {
		return Sandbox{}, err
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return Sandbox{}, err
	}
	network, policy, err := normalizeNetwork(req.Network, req.AllowInternetAccess)
	if err != nil {
		return Sandbox{}, err
	}
	tpl, alias, err := d.ResolveTemplate(ctx, req.Template)
	var snap *store.Snapshot
	if errdefs.Is(err, errdefs.KindNotFound) {
		// E2B addresses snapshots like templates.
		if sn, serr := d.lookupSnapshot(ctx, req.Template); serr == nil {
			snap, err = &sn, nil
		}
	}
	if err != nil {
		return Sandbox{}, err
	}
	if err := d.checkPlacement(policy); err != nil {
		return Sandbox{}, err
	}
	if err := d.checkSecrets(ctx, policy); err != nil {
		return Sandbox{}, err
	}

	id, err := NewSandboxID()
	if err != nil {
		return Sandbox{}, err
	}
	sb := Sandbox{
		ID: id, TemplateID: tpl.ID, Alias: alias, State: store.StateCreating,
		Metadata: req.Metadata, EnvVars: req.EnvVars,
		AllowPublicTraffic: req.Network.PublicTraffic(), AllowInternetAccess: req.AllowInternetAccess,
		CPU: tpl.CPU, MemoryMB: tpl.MemoryMB, DiskMB: cmp.Or(tpl.DiskMB, d.opts.DefaultDiskMB), EnvdVersion: tpl.EnvdVersion,
		NodeID:    d.opts.NodeID,
		AutoPause: req.AutoPause, AutoPauseMemory: req.AutoPauseMemory == nil || *req.AutoPauseMemory,
		AutoResume: req.AutoResume,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if sb.EnvVars == nil {
		sb.EnvVars = map[string]string{}
	}
	sb.VolumeMounts = mounts
	if snap != nil {
		// The checkpoint restores only with the mounts it was taken with.
		if len(mounts) > 0 && !sameMounts(mounts, snap.VolumeMounts) {
			return Sandbox{}, errdefs.InvalidArgument("a sandbox created from a snapshot mounts the snapshot's volumes; leave volumeMounts out or give the same ones")
		}
		sandboxFromSnapshot(&sb, *snap)
		sb.VolumeMounts = snap.VolumeMounts
	}
	if req.Secure {
		if sb.EnvdAccessToken, err = newToken(); err != nil {
			return Sandbox{}, err
		}
	}
	if !sb.AllowPublicTraffic {
		if sb.TrafficAccessToken, err = newToken(); err != nil {
			return Sandbox{}, err
		}
	}
	if network != nil {
		// The normal form, secrets included: the node needs the proxy credentials again whenever
		// it rebuilds the policy. Only NetworkOf decides what clients may read back.
		if sb.Network, err = json.Marshal(network); err != nil {
			return Sandbox{}, fmt.Errorf("encode network config: %w", err)
		}
	}

	var boot func() (node.Info, error)
	if snap != nil {
		boot = func() (node.Info, error) {
			return d.bootFromSnapshot(ctx, sb, snapshotSource{snapID: snap.ID}, policy)
		}
	} else {
		boot = func() (node.Info, error) { return d.boot(ctx, sb, tpl, policy) }
	}
	sb, err = d.startRecord(ctx, sb, timeout, boot)
	if err != nil {
		return Sandbox{}, err
	}
	if snap != nil {
		d.sbLog(sb.ID, sandboxlog.LevelInfo, "sandbox created from snapshot "+snap.ID, "snapshot", snap.ID, "template", sb.TemplateID, "cpu", itoa(sb.CPU), "memoryMB", itoa(sb.MemoryMB), "diskMB", itoa(sb.DiskMB), "timeout", secs(timeout))
	} else {
		d.sbLog(sb.ID, sandboxlog.LevelInfo, "sandbox created from template "+cmp.Or(alias, tpl.ID), "template", tpl.ID, "alias", alias, "cpu", itoa(sb.CPU), "memoryMB", itoa(sb.MemoryMB), "diskMB", itoa(sb.DiskMB), "timeout", secs(timeout))
	}
	if snap == nil {
		if err := d.store.RecordSpawn(context.WithoutCancel(ctx), tpl.ID, sb.StartedAt); err != nil {
			d.log.Warn("count template spawn", "template", tpl.ID, "err", err)
		}
	}
	return sb, nil
}

// startRecord reserves capacity with sb's creating record, runs boot in a boot slot and makes
// the record running with an end timeout after the sandbox became usable. Any failure removes the
// record and whatever the node got as far as starting.
func (d *Driver) startRecord(ctx context.Context, sb Sandbox, timeout time.Duration, boot func() (node.Info, error)) (Sandbox, error) {
	id := sb.ID
	now := d.now()
	sb.StartedAt, sb.EndAt = now, now.Add(timeout)
	if err := d.reserve(ctx, sb); err != nil {
		return Sandbox{}, err
	}
	// From here on the record reserves capacity: every failure must remove it.
	cleanupCtx := context.WithoutCancel(ctx)
	booted := false
	ok := false
	defer func() {
		if ok {
			return
		}
		if booted {
			d.destroyQuietly(cleanupCtx, id)
		}
		if err := d.store.DeleteSandbox(cleanupCtx, id); err != nil {
			d.log.Error("remove record of failed create", "sandbox", id, "err", err)
		}
	}()

	release, err := d.acquireBootSlot(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	info, err := boot()
	release()
	if err != nil {
		// The node rolls back its own partial work; destroy anyway in case it got far enough to
		// leave something, since "already gone" is success for Destroy.
		d.destroyQuietly(cleanupCtx, id)
		return Sandbox{}, err
	}
	booted = true

	// The timeout counts from when the sandbox is usable, not from when the request arrived.
	now = d.now()
	sb.State = store.StateRunning
	sb.StartedAt, sb.EndAt = now, now.Add(timeout)
	if info.EnvdVersion != "" {
		sb.EnvdVersion = info.EnvdVersion
	}
	if info.Node != "" && info.Node != sb.NodeID {
		// Placement chose among several nodes: later calls for the sandbox go to this one.
		sb.NodeID = info.Node
		if err := d.store.SetSandboxNode(cleanupCtx, id, sb.NodeID); err != nil {
			return Sandbox{}, err
		}
	}
	if err := d.store.MarkRunning(cleanupCtx, id, sb.StartedAt, sb.EndAt, sb.EnvdVersion); err != nil {
		return Sandbox{}, err
	}
	ok = true
	d.track(sb)
	d.log.Info("sandbox created", "sandbox", id, "template", sb.TemplateID, "timeout", timeout)
	return sb, nil
}

// reserve checks capacity and inserts the creating record as one step, so concurrent creates can
// never overshoot MaxSandboxes.
func (d *Driver) reserve(ctx context.Context, sb Sandbox) error {
	d.createMu.Lock()
	defer d.createMu.Unlock()
	if err := d.capacityLeft(ctx, "for another sandbox"); err != nil {
		return err
	}
	sb.Driver = d.opts.Name
	return d.store.InsertSandbox(ctx, sb)
}

// capacityLeft refuses (429, E2B's capacity code) when the node already holds MaxSandboxes
// sandboxes that are running or starting. The caller holds createMu.
func (d *Driver) capacityLeft(ctx context.Context, what string) error {
	limit := d.opts.MaxSandboxes
	if limit <= 0 {
		return nil
	}
	n, err := d.store.CountSandboxes(ctx, store.SandboxQuery{
		States: []store.SandboxState{store.StateCreating, store.StateRunning},
		NodeID: d.opts.NodeID,
	})
	if err != nil {
		return err
	}
	if n >= limit {
		return errdefs.WithCode(errdefs.ResourceExhausted(
			"no capacity %s: %d of %d sandboxes are running or starting on this host; kill one or raise the limit",
			what, n, limit), CapacityErrorCode)
	}
	return nil
}

// BootQueue is how many boots are under way and how many wait for a slot.
func (d *Driver) BootQueue() (booting, waiting int) {
	return len(d.bootSlots), int(d.bootWaiting.Load())
}

// acquireBootSlot waits for one of the BootConcurrency slots, at most BootQueueTimeout.
func (d *Driver) acquireBootSlot(ctx context.Context) (release func(), err error) {
	select {
	case d.bootSlots <- struct{}{}:
		return func() { <-d.bootSlots }, nil
	default:
	}
	d.bootWaiting.Add(1)
	defer d.bootWaiting.Add(-1)
	t := time.NewTimer(d.opts.BootQueueTimeout)
	defer t.Stop()
	select {
	case d.bootSlots <- struct{}{}:
		return func() { <-d.bootSlots }, nil
	case <-t.C:
		return nil, errdefs.Unavailable("too many sandboxes are starting at once (%d boot slots busy for %v); retry shortly",
			cap(d.bootSlots), d.opts.BootQueueTimeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a boot slot: %w", ctx.Err())
	}
}

// boot asks the node to create the sandbox. The call is detached from the client's context: a
// client hanging up mid-boot must not leave a half-built sandbox; the bounded CreateTimeout
// applies instead.
func (d *Driver) boot(ctx context.Context, sb Sandbox, tpl store.Template, policy egress.Policy) (node.Info, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.CreateTimeout)
	defer cancel()
	user := tpl.DefaultUser
	if user == "" {
		user = defaultUser
	}
	info, err := d.node.CreateSandbox(bctx, node.CreateSpec{
		ID: sb.ID, TemplateID: sb.TemplateID, BuildID: tpl.BuildID, CPUs: sb.CPU, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, EnvVars: sb.EnvVars, AccessToken: sb.EnvdAccessToken,
		DefaultUser: user, DefaultWorkdir: tpl.DefaultWorkdir, Egress: policy, Volumes: nodeMounts(sb.VolumeMounts),
	})
	if err != nil {
		d.log.Error("node failed to create sandbox", "sandbox", sb.ID, "template", sb.TemplateID, "err", err)
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return node.Info{}, err
		}
		return node.Info{}, errdefs.Wrap(errdefs.KindUnknown, err, "failed to start the sandbox")
	}
	return info, nil
}

func (d *Driver) destroyQuietly(ctx context.Context, id string) {
	if err := d.node.DestroySandbox(ctx, id); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		d.log.Error("destroy sandbox during rollback", "sandbox", id, "err", err)
	}
}

// checkTimeout validates a client-given duration against [0, MaxTimeout].
func (d *Driver) checkTimeout(field string, t time.Duration) error {
	if t < 0 {
		return errdefs.InvalidArgument("%s must not be negative", field)
	}
	if t > d.opts.MaxTimeout {
		return errdefs.InvalidArgument("%s of %ds exceeds the maximum of %ds", field,
			int64(t/time.Second), int64(d.opts.MaxTimeout/time.Second))
	}
	return nil
}

// Limits on what a create may carry. Environment variables reach every process the sandbox
// runs, so they must fit what execve accepts; metadata is stored and listed with every record.
const (
	// MaxEnvVarBytes is the longest "KEY=VALUE" string execve takes (MAX_ARG_STRLEN, 128 KiB with
	// its terminating NUL). A longer one would make every command in the sandbox fail.
	MaxEnvVarBytes = 128<<10 - 1
	// MaxEnvVarsBytes bounds all of them together, leaving most of execve's 2 MiB (ARG_MAX) for
	// each command's own arguments and variables.
	MaxEnvVarsBytes = 512 << 10
	// MaxMetadataBytes bounds a sandbox's metadata, keys and values together.
	MaxMetadataBytes = 64 << 10
)

func validateEnvVars(env map[string]string) error {
	total := 0
	for k, v := range env {
		// A process environment cannot represent these; failing here beats a confusing envd error.
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.InvalidArgument("envVars: invalid variable name %q (must be non-empty, without '=' or NUL)", k)
		}
		if strings.ContainsRune(v, 0) {
			return errdefs.InvalidArgument("envVars: value of %q contains a NUL byte", k)
		}
		n := len(k) + 1 + len(v)
		if n > MaxEnvVarBytes {
			return errdefs.InvalidArgument("envVars: %q is %d bytes as NAME=value, over the limit of %d", k, n, MaxEnvVarBytes)
		}
		total += n + 1
	}
	if total > MaxEnvVarsBytes {
		return errdefs.InvalidArgument("envVars: %d bytes in all, over the limit of %d", total, MaxEnvVarsBytes)
	}
	return nil
}

func validateMetadata(meta map[string]string) error {
	total := 0
	for k, v := range meta {
		if k == "" {
			return errdefs.InvalidArgument("metadata: keys must not be empty")
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errdefs.InvalidArgument("metadata: %d bytes in all, over the limit of %d", total, MaxMetadataBytes)
	}
	return nil
}

// ResolveTemplate finds a ready template by id or name. Names may carry a ":tag" (":default" is the
// implicit tag) and a "namespace/" prefix, which a single-tenant vmon also resolves without the
// namespace. It returns the name the sandbox should report as its alias.
func (d *Driver) ResolveTemplate(ctx context.Context, ref string) (store.Template, string, error) {
	tpl, alias, err := d.LookupTemplate(ctx, ref)
	if err != nil {
		return store.Template{}, "", err
	}
	tag := "default"
	// An alias that carries the tag itself ("name:tag" registered as a name) is its own build.
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') && !strings.Contains(alias, ":") {
		tag = strings.ToLower(ref[i+1:])
	}
	// Templates built from steps name their builds by tag; the tag's build supplies the
	// sandbox's resources and user. A template without tags (base) is its own build.
	bid, err := d.store.TagBuild(ctx, tpl.ID, tag)
	switch {
	case err == nil:
		b, err := d.store.GetBuild(ctx, tpl.ID, bid)
		if err != nil {
			return store.Template{}, "", err
		}
		tpl.BuildID, tpl.CPU, tpl.MemoryMB = b.ID, b.CPU, b.MemoryMB
		tpl.DefaultUser, tpl.DefaultWorkdir, tpl.Status = b.DefaultUser, b.DefaultWorkdir, b.Status
	case !errdefs.Is(err, errdefs.KindNotFound):
		return store.Template{}, "", err
	case tag != "default":
		return store.Template{}, "", errdefs.NotFound("template %q has no tag %q", tpl.ID, tag)
	default:
		if tags, err := d.store.ListTags(ctx, tpl.ID); err != nil {
			return store.Template{}, "", err
		} else if len(tags) > 0 {
			return store.Template{}, "", errdefs.NotFound("template %q has no tag %q", tpl.ID, tag)
		}
	}
	if tpl.Status != store.TemplateReady {
		return store.Template{}, "", errdefs.NotFound("template %q is not ready (status %s)", ref, tpl.Status)
	}
	return tpl, alias, nil
}

// LookupTemplate is ResolveTemplate without the readiness check.
func (d *Driver) LookupTemplate(ctx context.Context, ref string) (store.Template, string, error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	if ref == "" {
		return store.Template{}, "", errdefs.InvalidArgument("templateID is required")
	}
	for _, cand := range templateCandidates(ref) {
		tpl, err := d.store.TemplateByAlias(ctx, cand)
		if err == nil {
			return tpl, cand, nil
		}
		if !errdefs.Is(err, errdefs.KindNotFound) {
			return store.Template{}, "", err
		}
		tpl, err = d.store.GetTemplate(ctx, cand)
		if err == nil {
			alias := ""
			if len(tpl.Aliases) > 0 {
				alias = tpl.Aliases[0]
			}
			return tpl, alias, nil
		}
		if !errdefs.Is(err, errdefs.KindNotFound) {
			return store.Template{}, "", err
		}
	}
	return store.Template{}, "", errdefs.NotFound("template %q not found", ref)
}

// templateCandidates lists the names ref may be stored under, most specific first.
func templateCandidates(ref string) []string {
	name, tag := ref, ""
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		name, tag = ref[:i], ref[i+1:]
	}
	var out []string
	add := func(n string) {
		for _, o := range out {
			if o == n {
				return
			}
		}
		out = append(out, n)
	}
	// Tags of templates built from steps are resolved by ResolveTemplate, so the bare name is a
	// candidate whatever the tag.
	withTag := func(n string) {
		if tag != "" {
			add(n + ":" + tag)
		}
		add(n)
	}
	add(ref)
	withTag(name)
	if i := strings.IndexByte(name, '/'); i >= 0 {
		withTag(name[i+1:])
	}
	return out
}
