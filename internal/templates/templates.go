// Package templates owns the E2B template build flow: template identity (names, tags), build
// records and their status, upload tokens for COPY files, the bound on concurrent builds, and
// which build a tag points at once a build succeeds. It runs builds through the build engine and
// keeps records in the store; it never touches layers, mounts or sandboxes itself, and never
// speaks HTTP (the api package does).
package templates

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
)

// Engine runs one build (*build.Engine).
type Engine interface {
	Run(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error)
}

// Resolver finds a ready template build by id or name[:tag] (the driver).
type Resolver interface {
	ResolveTemplate(ctx context.Context, ref string) (store.Template, string, error)
}

// Files keeps the archives the SDK uploads for COPY steps: *build.Files in the data dir, or
// *tplstore.Files in the cluster's store where several drivers answer one build's calls.
type Files interface {
	Has(ctx context.Context, templateID, hash string) (bool, error)
	Put(ctx context.Context, templateID, hash string, r io.Reader, size int64) error
	RemoveTemplate(ctx context.Context, templateID string) error
}

// Options configure a Service.
type Options struct {
	DataDir  string
	Store    *store.Store
	Engine   Engine
	Files    Files
	Resolver Resolver
	// MaxConcurrent bounds builds running at once; more wait in status "waiting". Default 2.
	MaxConcurrent int
	// UploadTTL is how long an upload URL stays valid (E2B's SDK allows an hour per upload).
	UploadTTL time.Duration
	// UploadKey signs upload URLs. Drivers sharing a database share it, so an upload URL one
	// gave out is good at every other. Nil: a key of this process's own.
	UploadKey []byte
	Log       *slog.Logger
	// Rescan registers templates built on this host since the server started (`vmon template
	// build` of a rootfs while it runs); a build from a template the store does not know calls it
	// once before giving up. Nil: only what the store knows.
	Rescan func(ctx context.Context) error
	// CheckStart refuses a start command this node cannot run (e.g. one of vmon's own programs
	// that is not installed), before the build starts and waits for it. Nil: every one is tried.
	CheckStart func(startCmd string) error
	// Observe, when set, is told of each build that ran: how long it took, its steps and how
	// many of them the build cache had (metrics).
	Observe func(took time.Duration, steps, cached int, err error)
	// RemoteParents: builds run on nodes that hold the parent template, not in DataDir, so a
	// build's parent is named by its ids and the node that runs it resolves its layers.
	RemoteParents bool
	// Driver names this driver on the builds it runs, when drivers share the store: a restart
	// then fails only its own unfinished builds, not those another driver is running. "": alone.
	Driver string
}

// A build's record (status, tags, which start claimed it) is in the store; so is its log where
// drivers share the store, written as the build runs. Any driver then answers a build's create,
// upload, start and status, whichever of them runs it: only the running itself is local.

// Service runs the template build API.
type Service struct {
	opts  Options
	slots chan struct{}
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	// gcMu is held shared by every running build and exclusively by layer collection, which
	// must never see a build's fresh layers before its manifest names them.
	gcMu sync.RWMutex

	mu sync.Mutex
	// active are the builds this driver runs.
	// +checklocks:mu
	active map[string]*running
}

type running struct {
	log  *build.Log
	sink *logSink // nil unless the store is shared
	done chan struct{}
}

// DefaultTag is the tag a name without one means.
const DefaultTag = "default"

// Defaults of a template's sandboxes when a build asks for none (E2B's base: 2 vCPU, 512 MB).
const (
	DefaultCPUs     = 2
	DefaultMemoryMB = 512
)

// New returns the service; call Recover before serving and Close at exit.
func New(o Options) *Service {
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 2
	}
	if o.UploadTTL == 0 {
		o.UploadTTL = time.Hour
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.UploadKey == nil {
		o.UploadKey = make([]byte, 32)
		if _, err := rand.Read(o.UploadKey); err != nil {
			panic(fmt.Sprintf("templates: no randomness for the upload key: %v", err))
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Service{opts: o, slots: make(chan struct{}, o.MaxConcurrent), ctx: ctx, stop: stop,
		active: map[string]*running{}}
}

// Recover fails builds a previous run left unfinished: nothing runs them any more.
func (s *Service) Recover(ctx context.Context) error {
	var of []store.BuildsOf
	if s.opts.Driver != "" {
		of = append(of, store.BuildsOf{Driver: s.opts.Driver})
	}
	n, err := s.opts.Store.FailUnfinishedBuilds(ctx, "the build was interrupted by a server restart", time.Now(), of...)
	if n > 0 {
		s.opts.Log.Warn("failed builds interrupted by a restart", "builds", n)
	}
	s.collect(ctx)
	return err
}

// collector is the engine's layer garbage collection (*build.Engine).
type collector interface {
	GC(ctx context.Context) (int, error)
}

// collect removes layers no build needs any more, unless a build is running (it will be done at
// the next delete or start).
func (s *Service) collect(ctx context.Context) {
	gc, ok := s.opts.Engine.(collector)
	if !ok || !s.gcMu.TryLock() {
		return
	}
	defer s.gcMu.Unlock()
	n, err := gc.GC(ctx)
	if err != nil {
		s.opts.Log.Warn("collecting unused template layers", "err", err)
	}
	if n > 0 {
		s.opts.Log.Info("removed unused template layers", "layers", n)
	}
}

// Close cancels running builds and waits for them to clean up.
func (s *Service) Close() {
	s.stop()
	s.wg.Wait()
}

var (
	nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	tagRe  = regexp.MustCompile(`^[a-z0-9_.-]+$`)
	uuidRe = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// ParseName splits "[namespace/]name[:tag]" into the name templates are stored under and the
// tag ("" when none was given). A single-tenant vmon drops the namespace.
func ParseName(ref string) (name, tag string, err error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	name = ref
	if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		name, tag = ref[:i], ref[i+1:]
		if !tagRe.MatchString(tag) || uuidRe.MatchString(tag) || len(tag) > 128 {
			return "", "", errdefs.InvalidArgument("invalid tag %q: use lowercase letters, digits, '-', '_' and '.' (not a UUID)", tag)
		}
	}
	if i := strings.IndexByte(name, '/'); i >= 0 {
		ns := name[:i]
		name = name[i+1:]
		if !nameRe.MatchString(ns) {
			return "", "", errdefs.InvalidArgument("invalid namespace %q", ns)
		}
	}
	if !nameRe.MatchString(name) || len(name) > 128 {
		return "", "", errdefs.InvalidArgument("invalid template name %q: use lowercase letters, digits, '-' and '_'", ref)
	}
	return name, tag, nil
}

// CreateRequest is POST /v3/templates.
type CreateRequest struct {
	Name     string
	Tags     []string
	CPUs     int
	MemoryMB int
}

// Created answers a create.
type Created struct {
	TemplateID, BuildID string
	Names, Tags         []string
	Aliases             []string
}

// Create registers a new build of the template called req.Name, creating the template when the
// name is new. The build waits for StartBuild.
func (s *Service) Create(ctx context.Context, req CreateRequest) (Created, error) {
	name, tag, err := ParseName(req.Name)
	if err != nil {
		return Created{}, err
	}
	tags := []string{}
	if tag != "" {
		tags = append(tags, tag)
	}
	for _, t := range req.Tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if !tagRe.MatchString(t) || uuidRe.MatchString(t) || len(t) > 128 {
			return Created{}, errdefs.InvalidArgument("invalid tag %q", t)
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if req.CPUs == 0 {
		req.CPUs = DefaultCPUs
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = DefaultMemoryMB
	}
	if req.CPUs < 1 || req.CPUs > 64 {
		return Created{}, errdefs.InvalidArgument("cpuCount must be between 1 and 64 (got %d)", req.CPUs)
	}
	if req.MemoryMB < 128 || req.MemoryMB > 256<<10 || req.MemoryMB%2 != 0 {
		return Created{}, errdefs.InvalidArgument("memoryMB must be an even number between 128 and %d (got %d)", 256<<10, req.MemoryMB)
	}
	now := time.Now().UTC()
	tpl, err := s.opts.Store.TemplateByAlias(ctx, name)
	switch {
	case err == nil:
		if tpl.ID == template.BaseID {
			return Created{}, errdefs.InvalidArgument("the base template is built with `vmon template build base`")
		}
	case errdefs.Is(err, errdefs.KindNotFound):
		id, err := newTemplateID()
		if err != nil {
			return Created{}, err
		}
		tpl = store.Template{ID: id, Aliases: []string{name}, CPU: req.CPUs, MemoryMB: req.MemoryMB,
			EnvdVersion: agentproto.EnvdVersion, Status: store.TemplateWaiting, CreatedAt: now, UpdatedAt: now}
	default:
		return Created{}, err
	}
	buildID := uuid.NewString()
	if tpl.Status != store.TemplateReady {
		tpl.Status, tpl.BuildID, tpl.UpdatedAt = store.TemplateWaiting, buildID, now
	}
	if err := s.opts.Store.PutTemplate(ctx, tpl); err != nil {
		return Created{}, err
	}
	if err := s.opts.Store.PutBuild(ctx, store.Build{ID: buildID, TemplateID: tpl.ID, Status: store.TemplateWaiting,
		CPU: req.CPUs, MemoryMB: req.MemoryMB, CreatedAt: now, UpdatedAt: now, Driver: s.opts.Driver, Tags: tags}); err != nil {
		return Created{}, err
	}
	// A client that created a build and went away must not leave it waiting for ever.
	if n, err := s.opts.Store.FailUnstartedBuilds(ctx, now.Add(-unstartedTTL), now); err != nil {
		s.opts.Log.Warn("fail builds never started", "err", err)
	} else if n > 0 {
		s.opts.Log.Info("failed builds never started", "builds", n)
	}
	names := []string{name}
	for _, t := range tags {
		names = append(names, name+":"+t)
	}
	return Created{TemplateID: tpl.ID, BuildID: buildID, Names: names, Tags: tags, Aliases: []string{name}}, nil
}

// unstartedTTL is how long a created build may wait for its start before it is failed.
const unstartedTTL = time.Hour

func newTemplateID() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate template id: %w", err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// FileStatus answers whether a COPY archive is stored and, when it is not, a token to upload it
// with.
func (s *Service) FileStatus(ctx context.Context, templateID, hash string) (present bool, token string, err error) {
	if _, err := s.opts.Store.GetTemplate(ctx, templateID); err != nil {
		return false, "", err
	}
	present, err = s.opts.Files.Has(ctx, templateID, hash)
	if err != nil {
		return false, "", err
	}
	// expiry (Unix ms) . nonce . MAC over both: each call a fresh token.
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return false, "", err
	}
	signed := strconv.FormatInt(time.Now().Add(s.opts.UploadTTL).UnixMilli(), 10) + "." + hex.EncodeToString(nonce[:])
	return present, signed + "." + s.uploadMAC(templateID, hash, signed), nil
}

// uploadMAC signs one upload: which archive of which template, until when. The token holds
// nothing else, so any driver with the key checks it without asking the one that gave it.
func (s *Service) uploadMAC(templateID, hash, signed string) string {
	m := hmac.New(sha256.New, s.opts.UploadKey)
	m.Write([]byte("vmon-build-upload\x00" + templateID + "\x00" + hash + "\x00" + signed))
	return hex.EncodeToString(m.Sum(nil))
}

// Upload stores a COPY archive sent to an upload URL. The token is the URL's credential: the SDK
// sends no API key with it.
func (s *Service) Upload(ctx context.Context, templateID, hash, token string, r io.Reader, size int64) error {
	i := strings.LastIndexByte(token, '.')
	if i < 0 {
		return errdefs.Unauthorized("invalid or expired upload URL")
	}
	signed, mac := token[:i], token[i+1:]
	expires, _, _ := strings.Cut(signed, ".")
	ms, err := strconv.ParseInt(expires, 10, 64)
	if err != nil || !hmac.Equal([]byte(mac), []byte(s.uploadMAC(templateID, hash, signed))) ||
		!time.Now().Before(time.UnixMilli(ms)) {
		return errdefs.Unauthorized("invalid or expired upload URL")
	}
	if size < 0 {
		return errdefs.InvalidArgument("uploads need a Content-Length")
	}
	// A URL outlives its template's deletion; what it stored then would be kept for nothing.
	if _, err := s.opts.Store.GetTemplate(ctx, templateID); err != nil {
		return err
	}
	return s.opts.Files.Put(ctx, templateID, hash, r, size)
}

// Wire types of the build API, defined by the build engine.
type (
	Step     = build.Step
	Registry = build.Registry
	LogEntry = build.Entry
)

// StartSpec is POST /v2/templates/{id}/builds/{buildID} (TemplateBuildStartV2).
type StartSpec struct {
	FromImage         string
	FromTemplate      string
	FromImageRegistry *Registry
	StartCmd          string
	ReadyCmd          string
	Force             bool
	Steps             []Step
}

// StartBuild validates a build's steps and runs it in the background.
func (s *Service) StartBuild(ctx context.Context, templateID, buildID string, spec StartSpec) error {
	b, err := s.opts.Store.GetBuild(ctx, templateID, buildID)
	if err != nil {
		return err
	}
	if b.Status != store.TemplateWaiting || b.Started {
		return errdefs.Conflict("build %s was already started", buildID)
	}
	if isE2BBaseImage(spec.FromImage) && spec.FromTemplate == "" {
		// The SDK's default image (Template() with no from*, fromBaseImage()) is E2B's base
		// environment; vmon's base template is that environment, built offline.
		spec.FromImage = ""
	}
	if spec.StartCmd != "" && s.opts.CheckStart != nil {
		if err := s.opts.CheckStart(spec.StartCmd); err != nil {
			return err
		}
	}
	req := build.Request{TemplateID: templateID, BuildID: buildID, FromImage: spec.FromImage,
		FromImageRegistry: spec.FromImageRegistry, StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd,
		Force: spec.Force, Steps: spec.Steps, CPUs: b.CPU, MemoryMB: b.MemoryMB}
	if spec.FromImage == "" {
		from := spec.FromTemplate
		if from == "" {
			// The SDK's default image is E2B's base image; vmon's base template is its equivalent.
			from = template.BaseID
		}
		parent, err := s.parent(ctx, from)
		if err != nil {
			return err
		}
		if parent.TemplateID == templateID {
			return errdefs.InvalidArgument("a template cannot be built from itself")
		}
		req.FromTemplate = parent
	} else if spec.FromTemplate != "" {
		return errdefs.InvalidArgument("exactly one of fromImage and fromTemplate is allowed")
	}
	if err := req.Validate(); err != nil {
		return err
	}
	// Claim the build in the store, once it is known to be runnable: concurrent starts (an SDK
	// retry, through this driver or another) must not both run it.
	if err := s.opts.Store.ClaimBuild(ctx, templateID, buildID, s.opts.Driver, time.Now().UTC()); err != nil {
		return err
	}
	b.Started, b.Driver = true, s.opts.Driver
	log, err := build.NewLog(s.logPath(buildID))
	if err != nil {
		// Left claimed, the build would be neither run nor failed until this driver restarts.
		if rerr := s.opts.Store.ReleaseBuild(context.WithoutCancel(ctx), templateID, buildID); rerr != nil {
			s.opts.Log.Warn("release a build that could not start", "build", buildID, "err", rerr)
		}
		return err
	}
	run := &running{log: log, done: make(chan struct{})}
	if s.opts.Store.Shared() {
		run.sink = &logSink{st: s.opts.Store, buildID: buildID, log: log, warn: s.opts.Log}
		go run.sink.follow(s.ctx, run.done)
	}
	s.mu.Lock()
	s.active[buildID] = run
	s.mu.Unlock()
	s.wg.Add(1)
	go s.run(run, b, req)
	return nil
}

// isE2BBaseImage reports whether ref names E2B's base image, e2bdev/base.
func isE2BBaseImage(ref string) bool {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "docker.io/"), "index.docker.io/")
	return ref == "e2bdev/base" || ref == "e2bdev/base:latest"
}

// parent resolves fromTemplate to the build sandboxes of it run.
func (s *Service) parent(ctx context.Context, ref string) (*build.Parent, error) {
	tpl, _, err := s.opts.Resolver.ResolveTemplate(ctx, ref)
	if errdefs.Is(err, errdefs.KindNotFound) && s.opts.Rescan != nil {
		if rerr := s.opts.Rescan(ctx); rerr != nil {
			s.opts.Log.Warn("look for templates built since the server started", "err", rerr)
		}
		tpl, _, err = s.opts.Resolver.ResolveTemplate(ctx, ref)
	}
	if err != nil {
		return nil, err
	}
	if s.opts.RemoteParents {
		return &build.Parent{TemplateID: tpl.ID, BuildID: tpl.BuildID}, nil
	}
	return build.ResolveParent(s.opts.DataDir, tpl.ID, tpl.BuildID)
}

func (s *Service) logPath(buildID string) string {
	return filepath.Join(s.opts.DataDir, "build-logs", buildID+".jsonl")
}

func (s *Service) run(run *running, b store.Build, req build.Request) {
	defer s.wg.Done()
	defer close(run.done)
	defer func() {
		_ = run.log.Close()
		s.mu.Lock()
		delete(s.active, b.ID)
		s.mu.Unlock()
	}()
	ctx := s.ctx
	if len(s.slots) == cap(s.slots) {
		run.log.Add("info", "", "waiting for one of %d build slots", cap(s.slots))
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		s.fail(b, run, &build.StepError{Step: "base", Msg: "the server shut down before the build started"})
		return
	}
	defer func() { <-s.slots }()
	b.Status, b.UpdatedAt = store.TemplateBuilding, time.Now().UTC()
	if err := s.opts.Store.PutBuild(ctx, b); err != nil {
		s.opts.Log.Error("record build start", "build", b.ID, "err", err)
	}
	s.setTemplateStatus(b.TemplateID, store.TemplateBuilding)
	run.log.Add("info", "", "building template %s (build %s)", b.TemplateID, b.ID)
	s.gcMu.RLock()
	began := time.Now()
	m, err := s.opts.Engine.Run(ctx, req, run.log)
	s.gcMu.RUnlock()
	if s.opts.Observe != nil {
		s.opts.Observe(time.Since(began), len(req.Steps), cachedSteps(run.log), err)
	}
	if err != nil {
		s.fail(b, run, err)
		return
	}
	if err := s.succeed(b, run, m); err != nil {
		s.opts.Log.Error("record finished build", "build", b.ID, "err", err)
		s.fail(b, run, &build.StepError{Step: "finalize", Msg: "cannot record the build", Cause: err})
	}
}

// cachedSteps counts the steps a build's log says the cache had (the engine's "CACHED [i/n]"
// lines, whichever node ran it).
func cachedSteps(log *build.Log) int {
	n := 0
	for _, e := range log.Since(0, log.Len()) {
		if strings.HasPrefix(e.Message, "CACHED [") {
			n++
		}
	}
	return n
}

func (s *Service) fail(b store.Build, run *running, err error) {
	var se *build.StepError
	if !errors.As(err, &se) {
		se = &build.StepError{Msg: "internal error", Cause: err}
	}
	s.opts.Log.Warn("template build failed", "template", b.TemplateID, "build", b.ID, "step", se.Step, "err", err)
	run.log.Add("error", se.Step, "%s", reasonMessage(se))
	ctx := context.WithoutCancel(s.ctx)
	run.flush(ctx)
	now := time.Now().UTC()
	b.Status, b.ReasonMessage, b.ReasonStep, b.UpdatedAt, b.FinishedAt = store.TemplateError, reasonMessage(se), se.Step, now, now
	if err := s.opts.Store.PutBuild(ctx, b); err != nil {
		s.opts.Log.Error("record failed build", "build", b.ID, "err", err)
	}
	// A template keeps serving its last good build; one that never had one is in error.
	tags, _ := s.opts.Store.ListTags(ctx, b.TemplateID)
	if len(tags) == 0 {
		s.setTemplateStatus(b.TemplateID, store.TemplateError)
	} else {
		s.setTemplateStatus(b.TemplateID, store.TemplateReady)
	}
}

// reasonMessage is what the SDK's BuildError says: which step failed, then why.
func reasonMessage(se *build.StepError) string {
	switch se.Step {
	case "base":
		return "base image: " + se.Msg
	case "finalize":
		return "start/ready command: " + se.Msg
	case "":
		return "build failed: " + se.Msg
	default:
		return "step " + se.Step + ": " + se.Msg
	}
}

func (s *Service) succeed(b store.Build, run *running, m template.Manifest) error {
	ctx := context.WithoutCancel(s.ctx)
	tags := slices.Clone(b.Tags)
	existing, err := s.opts.Store.ListTags(ctx, b.TemplateID)
	if err != nil {
		return err
	}
	// A name without a tag builds the default tag; so does a template's first build, whatever
	// it was tagged, so the bare name always resolves.
	if len(b.Tags) == 0 || !slices.ContainsFunc(existing, func(t store.Tag) bool { return t.Tag == DefaultTag }) {
		if !slices.Contains(tags, DefaultTag) {
			tags = append(tags, DefaultTag)
		}
	}
	// The build reads as ready last: by then its tags point at it and the whole log is stored,
	// so a client that sees it ready (through any driver, which reads the record first, then the
	// log) creates sandboxes of it by tag and has every line.
	now := time.Now().UTC()
	b.DefaultUser, b.DefaultWorkdir = m.DefaultUser, m.DefaultWorkdir
	if err := s.opts.Store.SetTags(ctx, b.TemplateID, b.ID, tags, now); err != nil {
		return err
	}
	tpl, err := s.opts.Store.GetTemplate(ctx, b.TemplateID)
	if err != nil {
		return err
	}
	if def, err := s.opts.Store.TagBuild(ctx, b.TemplateID, DefaultTag); err == nil && def == b.ID {
		tpl.BuildID, tpl.CPU, tpl.MemoryMB = b.ID, b.CPU, b.MemoryMB
		tpl.DefaultUser, tpl.DefaultWorkdir = b.DefaultUser, b.DefaultWorkdir
	}
	tpl.Status, tpl.UpdatedAt = store.TemplateReady, now
	if err := s.opts.Store.PutTemplate(ctx, tpl); err != nil {
		return err
	}
	run.log.Add("info", "", "tagged %s", strings.Join(tags, ", "))
	run.flush(ctx)
	b.Status, b.UpdatedAt, b.FinishedAt = store.TemplateReady, now, now
	return s.opts.Store.PutBuild(ctx, b)
}

func (s *Service) setTemplateStatus(id string, st store.TemplateStatus) {
	ctx := context.WithoutCancel(s.ctx)
	tpl, err := s.opts.Store.GetTemplate(ctx, id)
	if err != nil {
		return
	}
	if st == store.TemplateBuilding && tpl.Status == store.TemplateReady {
		return // a rebuild does not take the template out of service
	}
	tpl.Status, tpl.UpdatedAt = st, time.Now().UTC()
	if err := s.opts.Store.PutTemplate(ctx, tpl); err != nil {
		s.opts.Log.Error("record template status", "template", id, "err", err)
	}
}

// Status is a build's state and a page of its log.
type Status struct {
	Build   store.Build
	Entries []LogEntry
}

// MaxLogPage is the most log entries one status call returns (E2B's limit).
const MaxLogPage = 100

// Status returns a build and its log entries from offset on.
func (s *Service) Status(ctx context.Context, templateID, buildID string, offset int) (Status, error) {
	b, err := s.opts.Store.GetBuild(ctx, templateID, buildID)
	if err != nil {
		return Status{}, err
	}
	if offset < 0 {
		return Status{}, errdefs.InvalidArgument("logsOffset must not be negative")
	}
	s.mu.Lock()
	run := s.active[buildID]
	s.mu.Unlock()
	var log *build.Log
	switch {
	case run != nil:
		log = run.log
		// Re-read: the build may have finished between the two reads; the log then holds
		// every line, so the status is read after the log to never report "ready" early.
		b, err = s.opts.Store.GetBuild(ctx, templateID, buildID)
		if err != nil {
			return Status{}, err
		}
	case s.opts.Store.Shared():
		// Run by another driver, or finished: the log as stored, read after the record (a
		// finished build's whole log is stored before it is recorded finished).
		rows, err := s.opts.Store.BuildLog(ctx, buildID, offset, MaxLogPage)
		if err != nil {
			return Status{}, err
		}
		entries := make([]LogEntry, len(rows))
		for i, r := range rows {
			entries[i] = LogEntry{Timestamp: r.Time, Level: r.Level, Step: r.Step, Message: r.Message}
		}
		return Status{Build: b, Entries: entries}, nil
	default:
		if l, err := build.ReadLog(s.logPath(buildID)); err == nil {
			log = l
		}
	}
	entries := []build.Entry{}
	if log != nil {
		entries = log.Since(offset, MaxLogPage)
	}
	return Status{Build: b, Entries: entries}, nil
}

// Wait blocks until a build finishes or ctx ends, and returns its record.
func (s *Service) Wait(ctx context.Context, templateID, buildID string) (store.Build, error) {
	s.mu.Lock()
	run := s.active[buildID]
	s.mu.Unlock()
	if run != nil {
		select {
		case <-run.done:
		case <-ctx.Done():
			return store.Build{}, ctx.Err()
		}
	}
	return s.opts.Store.GetBuild(ctx, templateID, buildID)
}

// Log returns the live log of a running build (nil once it finished).
func (s *Service) Log(buildID string) *build.Log {
	s.mu.Lock()
	defer s.mu.Unlock()
	if run := s.active[buildID]; run != nil {
		return run.log
	}
	return nil
}

// Delete removes a template, its builds, tags and uploads. Sandboxes running from it keep their
// layers; its builds' layers stay in the build cache.
func (s *Service) Delete(ctx context.Context, ref string) error {
	tpl, err := s.lookup(ctx, ref)
	if err != nil {
		return err
	}
	if tpl.ID == template.BaseID {
		return errdefs.InvalidArgument("the base template cannot be deleted")
	}
	// Any driver may be running one of its builds: the store refuses while one was started.
	if err := s.opts.Store.DeleteTemplate(ctx, tpl.ID); err != nil {
		return err
	}
	err = errors.Join(template.RemoveBuilds(s.opts.DataDir, tpl.ID), s.opts.Files.RemoveTemplate(ctx, tpl.ID))
	s.collect(context.WithoutCancel(ctx))
	return err
}

// lookup finds a template by id or name, ready or not.
func (s *Service) lookup(ctx context.Context, ref string) (store.Template, error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	if tpl, err := s.opts.Store.GetTemplate(ctx, ref); err == nil {
		return tpl, nil
	}
	name, _, err := ParseName(ref)
	if err != nil {
		return store.Template{}, errdefs.NotFound("template %q not found", ref)
	}
	return s.opts.Store.TemplateByAlias(ctx, name)
}

// AssignTags points tags at the build target ("name:tag" or "name") names.
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (string, []string, error) {
	tpl, _, err := s.opts.Resolver.ResolveTemplate(ctx, target)
	if err != nil {
		return "", nil, err
	}
	clean, err := cleanTags(tags)
	if err != nil {
		return "", nil, err
	}
	if err := s.opts.Store.SetTags(ctx, tpl.ID, tpl.BuildID, clean, time.Now().UTC()); err != nil {
		return "", nil, err
	}
	if slices.Contains(clean, DefaultTag) {
		if err := s.syncDefault(ctx, tpl.ID); err != nil {
			return "", nil, err
		}
	}
	return tpl.BuildID, clean, nil
}

// RemoveTags removes tags from the template called name.
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
	tpl, err := s.lookup(ctx, name)
	if err != nil {
		return err
	}
	clean, err := cleanTags(tags)
	if err != nil {
		return err
	}
	return s.opts.Store.RemoveTags(ctx, tpl.ID, clean)
}

// Tags lists a template's tags.
func (s *Service) Tags(ctx context.Context, ref string) ([]store.Tag, error) {
	tpl, err := s.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.opts.Store.ListTags(ctx, tpl.ID)
}

// syncDefault makes the template record describe the build its default tag names.
func (s *Service) syncDefault(ctx context.Context, id string) error {
	bid, err := s.opts.Store.TagBuild(ctx, id, DefaultTag)
	if err != nil {
		return err
	}
	b, err := s.opts.Store.GetBuild(ctx, id, bid)
	if err != nil {
		return err
	}
	tpl, err := s.opts.Store.GetTemplate(ctx, id)
	if err != nil {
		return err
	}
	tpl.BuildID, tpl.CPU, tpl.MemoryMB, tpl.DefaultUser, tpl.DefaultWorkdir = b.ID, b.CPU, b.MemoryMB, b.DefaultUser, b.DefaultWorkdir
	tpl.UpdatedAt = time.Now().UTC()
	return s.opts.Store.PutTemplate(ctx, tpl)
}

func cleanTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, errdefs.InvalidArgument("tags must not be empty")
	}
	var out []string
	for _, t := range tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if !tagRe.MatchString(t) || uuidRe.MatchString(t) || len(t) > 128 {
			return nil, errdefs.InvalidArgument("invalid tag %q", t)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}
