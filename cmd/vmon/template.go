package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/mountns"
	"github.com/vibemon/vmon/internal/template"
)

func templateCmd() *cobra.Command {
	var dataDir, apiURL, apiKey string
	cmd := &cobra.Command{Use: "template", Short: "build, list and remove templates"}
	config.BindDataDir(cmd.PersistentFlags(), &dataDir)
	cmd.PersistentFlags().StringVar(&apiURL, "api-url", "http://127.0.0.1:3000", "API of the running `vmon serve` (for templates other than base)")
	cmd.PersistentFlags().StringVar(&apiKey, "api-key", "", "API key (default: <data-dir>/api-key)")
	client := func() (*apiClient, error) { return newAPIClient(dataDir, apiURL, apiKey, 2*time.Hour) }

	var (
		force, rootfsOnly        bool
		fromImage, fromTemplate  string
		regUser, regPassword     string
		steps, tags              []string
		contextDir, start, ready string
		cpus, memoryMB           int
	)
	build := &cobra.Command{
		Use:   "build NAME[:TAG]",
		Short: "build a template: base from this machine's Debian sources, others from an image or template plus steps",
		Long: `Build a template.

  vmon template build base [--force]
      builds the base template locally from this machine's Debian package sources (cached).

  vmon template build code-interpreter-v1 [--force]
      builds code-interpreter-v1-rootfs the same way (Python with the data stack, R, Node.js, a
      JDK and the code-execution service; a few minutes the first time), then has the running
      vmon serve make code-interpreter-v1 from it (vmon serve also does so when it starts).

  vmon template build NAME[:TAG] (--from-image REF | --from-template NAME) [--step STEP]...
      builds through the running vmon serve, like the SDK's Template.build. Steps run in order:
        --step 'RUN <command>'          --step 'RUN@root <command>' (as a user)
        --step 'COPY <src> <dest>'      (src relative to --context)
        --step 'ENV <key>=<value> ...'  --step 'WORKDIR <dir>'  --step 'USER <name>'
      --start-cmd/--ready-cmd set the command every sandbox starts with, ready when it exits 0.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == template.BaseID || args[0] == codeInterpreterID {
				// A local build removes an old rootfs only when no sandbox's overlay uses it,
				// and those overlays are in vmon serve's mount namespace.
				if err := mountns.Enter(dataDir); errors.Is(err, mountns.ErrInherited) {
					fmt.Fprintf(cmd.ErrOrStderr(), "vmon: %v\n", err)
				} else if err != nil {
					return err
				}
			}
			if args[0] == template.BaseID {
				return buildBase(cmd, dataDir, force)
			}
			if args[0] == codeInterpreterID {
				if rootfsOnly {
					client = func() (*apiClient, error) { return nil, errors.New("--rootfs-only") }
				}
				return buildCodeInterpreter(cmd, dataDir, force, client)
			}
			c, err := client()
			if err != nil {
				return err
			}
			spec := cliBuild{name: args[0], fromImage: fromImage, fromTemplate: fromTemplate, regUser: regUser,
				regPassword: regPassword, steps: steps, tags: tags, contextDir: contextDir, start: start, ready: ready,
				cpus: cpus, memoryMB: memoryMB, force: force}
			return spec.run(cmd.Context(), c, cmd.ErrOrStderr())
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild every step (base: rebuild even if built)")
	build.Flags().BoolVar(&rootfsOnly, "rootfs-only", false, "code-interpreter-v1: build its rootfs only, leave the template to vmon serve's next start")
	build.Flags().StringVar(&fromImage, "from-image", "", "OCI image to start from, e.g. python:3.12")
	build.Flags().StringVar(&fromTemplate, "from-template", "", "template to start from (default base when no --from-image)")
	build.Flags().StringVar(&regUser, "registry-user", "", "registry user for --from-image")
	build.Flags().StringVar(&regPassword, "registry-password", "", "registry password for --from-image (or VMON_REGISTRY_PASSWORD)")
	build.Flags().StringArrayVar(&steps, "step", nil, "a build step (repeatable, in order): RUN, RUN@user, COPY, ENV, WORKDIR, USER")
	build.Flags().StringSliceVar(&tags, "tag", nil, "extra tags for this build")
	build.Flags().StringVar(&contextDir, "context", ".", "directory COPY sources are relative to")
	build.Flags().StringVar(&start, "start-cmd", "", "command every sandbox of the template starts with")
	build.Flags().StringVar(&ready, "ready-cmd", "", "command that exits 0 once the start command is ready")
	build.Flags().IntVar(&cpus, "cpu", 0, "vCPUs of the template's sandboxes (default 2)")
	build.Flags().IntVar(&memoryMB, "memory-mb", 0, "memory of the template's sandboxes in MiB (default 512)")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "list templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return listLocal(cmd, dataDir, err)
			}
			var tpls []struct {
				TemplateID  string    `json:"templateID"`
				BuildID     string    `json:"buildID"`
				Aliases     []string  `json:"aliases"`
				CPUCount    int       `json:"cpuCount"`
				MemoryMB    int       `json:"memoryMB"`
				BuildStatus string    `json:"buildStatus"`
				UpdatedAt   time.Time `json:"updatedAt"`
			}
			if err := c.do(cmd.Context(), http.MethodGet, "/templates", nil, &tpls); err != nil {
				return listLocal(cmd, dataDir, err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAMES\tSTATUS\tCPUS\tMEMORY_MB\tBUILD\tUPDATED")
			for _, t := range tpls {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", t.TemplateID, strings.Join(t.Aliases, ","), t.BuildStatus,
					t.CPUCount, t.MemoryMB, t.BuildID, t.UpdatedAt.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}

	rm := &cobra.Command{
		Use:   "rm NAME|ID",
		Short: "delete a template (running sandboxes keep theirs)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if err := c.do(cmd.Context(), http.MethodDelete, "/templates/"+args[0], nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "deleted template %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(build, ls, rm)
	return cmd
}

func buildBase(cmd *cobra.Command, dataDir string, force bool) error {
	if !force {
		if m, err := template.Load(dataDir, template.BaseID); err == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "template base is built (%s, %d MB); use --force to rebuild\n",
				m.BuiltAt.Format("2006-01-02 15:04"), m.DiskSizeMB)
			return nil
		}
	}
	m, err := template.BuildBase(cmd.Context(), template.BaseOptions{DataDir: dataDir, Force: force, Progress: os.Stderr})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "template base built in %.0fs (%d MB)\n", m.BuildSeconds, m.DiskSizeMB)
	return nil
}

// listLocal lists the templates built on this machine when no server answers.
func listLocal(cmd *cobra.Command, dataDir string, apiErr error) error {
	ms, err := template.List(dataDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "vmon serve did not answer (%v); listing the locally built base templates only\n", apiErr)
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCPUS\tMEMORY_MB\tDISK_MB\tBUILT")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", m.ID, m.CPUs, m.MemoryMB, m.DiskSizeMB, m.BuiltAt.Format("2006-01-02 15:04"))
	}
	return tw.Flush()
}

// cliBuild is `vmon template build NAME ...` for templates other than base.
type cliBuild struct {
	name, fromImage, fromTemplate string
	regUser, regPassword          string
	steps, tags                   []string
	contextDir, start, ready      string
	cpus, memoryMB                int
	force                         bool
}

type wireStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash,omitempty"`
}

// parseStep reads one --step: an instruction and its arguments.
func parseStep(s string) (wireStep, error) {
	instr, rest, _ := strings.Cut(strings.TrimSpace(s), " ")
	rest = strings.TrimSpace(rest)
	instr, user, _ := strings.Cut(instr, "@")
	switch strings.ToUpper(instr) {
	case "RUN":
		if rest == "" {
			return wireStep{}, fmt.Errorf("--step %q: RUN needs a command", s)
		}
		args := []string{rest}
		if user != "" {
			args = append(args, user)
		}
		return wireStep{Type: "RUN", Args: args}, nil
	case "COPY":
		f := strings.Fields(rest)
		if len(f) != 2 {
			return wireStep{}, fmt.Errorf("--step %q: COPY takes <src> <dest>", s)
		}
		return wireStep{Type: "COPY", Args: []string{f[0], f[1], user, ""}}, nil
	case "ENV":
		var args []string
		for _, kv := range strings.Fields(rest) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return wireStep{}, fmt.Errorf("--step %q: ENV takes <key>=<value> pairs", s)
			}
			args = append(args, k, v)
		}
		if len(args) == 0 {
			return wireStep{}, fmt.Errorf("--step %q: ENV takes <key>=<value> pairs", s)
		}
		return wireStep{Type: "ENV", Args: args}, nil
	case "WORKDIR", "USER":
		if rest == "" || strings.Contains(rest, " ") {
			return wireStep{}, fmt.Errorf("--step %q: %s takes one argument", s, strings.ToUpper(instr))
		}
		return wireStep{Type: strings.ToUpper(instr), Args: []string{rest}}, nil
	}
	return wireStep{}, fmt.Errorf("--step %q: unknown instruction (RUN, COPY, ENV, WORKDIR, USER)", s)
}

func (b cliBuild) run(ctx context.Context, c *apiClient, w interface{ Write([]byte) (int, error) }) error {
	if b.fromImage != "" && b.fromTemplate != "" {
		return errors.New("--from-image and --from-template are exclusive")
	}
	if b.regPassword == "" {
		b.regPassword = os.Getenv("VMON_REGISTRY_PASSWORD")
	}
	var steps []wireStep
	for _, s := range b.steps {
		ws, err := parseStep(s)
		if err != nil {
			return err
		}
		steps = append(steps, ws)
	}
	create := map[string]any{"name": b.name, "tags": b.tags}
	if b.cpus > 0 {
		create["cpuCount"] = b.cpus
	}
	if b.memoryMB > 0 {
		create["memoryMB"] = b.memoryMB
	}
	var created struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if err := c.do(ctx, http.MethodPost, "/v3/templates", create, &created); err != nil {
		return err
	}
	fmt.Fprintf(w, "template %s, build %s\n", created.TemplateID, created.BuildID)
	for i := range steps {
		if steps[i].Type != "COPY" {
			continue
		}
		a, err := archiveContext(b.contextDir, steps[i].Args[0], steps[i].Args[1])
		if err != nil {
			return err
		}
		steps[i].FilesHash = a.hash
		uploaded, err := c.uploadFiles(ctx, created.TemplateID, a)
		if err != nil {
			return fmt.Errorf("upload %s: %w", steps[i].Args[0], err)
		}
		if uploaded {
			fmt.Fprintf(w, "uploaded %s (%d bytes)\n", steps[i].Args[0], len(a.data))
		} else {
			fmt.Fprintf(w, "%s is already uploaded\n", steps[i].Args[0])
		}
	}
	body := map[string]any{"force": b.force, "steps": steps}
	switch {
	case b.fromImage != "":
		body["fromImage"] = b.fromImage
		if b.regUser != "" {
			body["fromImageRegistry"] = map[string]string{"type": "registry", "username": b.regUser, "password": b.regPassword}
		}
	case b.fromTemplate != "":
		body["fromTemplate"] = b.fromTemplate
	default:
		body["fromTemplate"] = template.BaseID
	}
	if b.start != "" {
		body["startCmd"] = b.start
	}
	if b.ready != "" {
		body["readyCmd"] = b.ready
	}
	if err := c.do(ctx, http.MethodPost, "/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, body, nil); err != nil {
		return err
	}
	st, err := c.followBuild(ctx, created.TemplateID, created.BuildID, w)
	if err != nil {
		return err
	}
	if st.Status != "ready" {
		msg := "unknown error"
		if st.Reason != nil {
			msg = st.Reason.Message
		}
		return fmt.Errorf("build failed: %s", msg)
	}
	fmt.Fprintf(w, "template %s is ready: Sandbox.create(%q)\n", b.name, b.name)
	return nil
}
