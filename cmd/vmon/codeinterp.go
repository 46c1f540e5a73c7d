package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/doctor"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
)

// The code-interpreter-v1 template (@e2b/code-interpreter's default): code-interpreter-v1-rootfs
// with the code-execution service as start command, saved started so every sandbox is restored
// with a warm Python kernel.
const (
	codeInterpreterID = "code-interpreter-v1"
	// As root, as E2B's template starts its service (sudo): kernels run as root, so a context may
	// work anywhere (cwd /root), while new contexts start in /home/user.
	codeInterpreterStart    = "sudo /opt/vmon/bin/vmon-code-interpreter --cwd /home/user --log-file /tmp/.vmon-code-interpreter.log"
	codeInterpreterReady    = "curl -sf http://127.0.0.1:49999/health"
	codeInterpreterCPUs     = 2
	codeInterpreterMemoryMB = 1024
	// codeInterpreterBinary is the service, installed beside envd and mounted with it.
	codeInterpreterBinary = doctor.CodeInterpreterBinary
)

// buildCodeInterpreter is `vmon template build code-interpreter-v1`: the rootfs locally, then
// the template through the running server (or at its next start).
func buildCodeInterpreter(cmd *cobra.Command, dataDir string, force bool, client func() (*apiClient, error)) error {
	w := cmd.ErrOrStderr()
	m, err := template.Load(dataDir, template.CodeInterpreterRootfsID)
	if missing := m.MissingPackages(template.CodeInterpreterPackages); err == nil && !force && len(missing) > 0 {
		fmt.Fprintf(w, "template %s lacks %s (added since it was built); building it again\n", m.ID, strings.Join(missing, ", "))
		force = true
	}
	if err != nil || force {
		if m, err = template.BuildCodeInterpreterRootfs(cmd.Context(), template.BaseOptions{DataDir: dataDir, Force: force, Progress: os.Stderr}); err != nil {
			return err
		}
		fmt.Fprintf(w, "template %s built in %.0fs (%d MB)\n", m.ID, m.BuildSeconds, m.DiskSizeMB)
	} else {
		fmt.Fprintf(w, "template %s is built (%s, %d MB); use --force to rebuild\n", m.ID, m.BuiltAt.Format("2006-01-02 15:04"), m.DiskSizeMB)
	}
	later := func(err error) error {
		fmt.Fprintf(w, "not asking vmon serve (%v): it makes %s from %s when it starts\n", err, codeInterpreterID, template.CodeInterpreterRootfsID)
		return nil
	}
	c, err := client()
	if err != nil {
		return later(err)
	}
	spec := cliBuild{name: codeInterpreterID, fromTemplate: template.CodeInterpreterRootfsID, start: codeInterpreterStart,
		ready: codeInterpreterReady, cpus: codeInterpreterCPUs, memoryMB: codeInterpreterMemoryMB, force: force}
	err = spec.run(cmd.Context(), c, w)
	var nerr *net.OpError
	if errors.As(err, &nerr) {
		return later(err)
	}
	return err
}

// ensureCodeInterpreter makes code-interpreter-v1 from its rootfs in the background when the
// template is missing or stale: made from an older rootfs build, or saved started with another
// envd build. Without the rootfs it says how to build it (minutes of downloads: never unasked).
func ensureCodeInterpreter(ctx context.Context, svc *templates.Service, st *store.Store, dataDir, envdPath string, log *slog.Logger) {
	rootfs, err := template.Load(dataDir, template.CodeInterpreterRootfsID)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmon: @e2b/code-interpreter needs the %s template; build it with `vmon template build %s` "+
			"(a few minutes and about 430 MB of Debian packages the first time)\n", codeInterpreterID, codeInterpreterID)
		return
	}
	if missing := rootfs.MissingPackages(template.CodeInterpreterPackages); len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "vmon: the %s template lacks %s (added by this vmon); run `vmon template build %s` to add them\n",
			template.CodeInterpreterRootfsID, strings.Join(missing, ", "), codeInterpreterID)
	}
	fresh, why := codeInterpreterFresh(ctx, st, dataDir, rootfs, envdPath)
	if fresh {
		return
	}
	if err := checkGuestPrograms(codeInterpreterStart, filepath.Dir(envdPath)); err != nil {
		log.Error("cannot make the code-interpreter template", "template", codeInterpreterID, "why", why, "err", err)
		return
	}
	log.Info("making the code-interpreter template", "template", codeInterpreterID, "why", why)
	created, err := svc.Create(ctx, templates.CreateRequest{Name: codeInterpreterID, CPUs: codeInterpreterCPUs, MemoryMB: codeInterpreterMemoryMB})
	if err == nil {
		err = svc.StartBuild(ctx, created.TemplateID, created.BuildID, templates.StartSpec{FromTemplate: template.CodeInterpreterRootfsID,
			StartCmd: codeInterpreterStart, ReadyCmd: codeInterpreterReady})
	}
	if err != nil {
		log.Error("could not start the code-interpreter template's build", "err", err)
		return
	}
	go func() {
		b, err := svc.Wait(context.WithoutCancel(ctx), created.TemplateID, created.BuildID)
		if err == nil && b.Status != store.TemplateReady {
			err = fmt.Errorf("build %s at step %s: %s", b.Status, b.ReasonStep, b.ReasonMessage)
		}
		if err != nil {
			log.Error("the code-interpreter template's build failed", "build", created.BuildID, "err", err)
			return
		}
		log.Info("code-interpreter template ready", "template", codeInterpreterID, "build", created.BuildID)
	}()
}

// codeInterpreterFresh says whether code-interpreter-v1 is built from rootfs's current build and
// saved started with the running envd build.
func codeInterpreterFresh(ctx context.Context, st *store.Store, dataDir string, rootfs template.Manifest, envdPath string) (bool, string) {
	tpl, err := st.TemplateByAlias(ctx, codeInterpreterID)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return false, "not built yet"
	}
	if err != nil || tpl.Status != store.TemplateReady {
		return false, "not ready"
	}
	m, err := template.LoadBuild(dataDir, tpl.ID, tpl.BuildID)
	if err != nil {
		return false, "its build manifest cannot be read"
	}
	if rel, err := filepath.Rel(dataDir, rootfs.RootfsDir()); err != nil || !slices.Contains(m.Layers, rel) {
		return false, "its rootfs was rebuilt"
	}
	if m.StartCmd != codeInterpreterStart {
		return false, "its start command changed"
	}
	if m.StartSnapshot == "" {
		return false, "it has no started snapshot"
	}
	meta, err := snapshot.Read(filepath.Join(dataDir, m.StartSnapshot))
	if err != nil {
		return false, "its started snapshot cannot be read"
	}
	if envd, _ := filepath.Rel(dataDir, filepath.Dir(envdPath)); meta.Envd != filepath.ToSlash(envd) {
		return false, "envd was upgraded"
	}
	return true, ""
}
