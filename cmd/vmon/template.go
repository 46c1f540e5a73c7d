package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/template"
)

func templateCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{Use: "template", Short: "build and list templates"}
	config.BindDataDir(cmd.PersistentFlags(), &dataDir)

	var force bool
	build := &cobra.Command{
		Use:   "build base",
		Short: "build the base template from this machine's Debian package sources (cached)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "base" {
				return fmt.Errorf("only the base template can be built here yet (got %q)", args[0])
			}
			if !force {
				if m, err := template.Load(dataDir, "base"); err == nil {
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
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even if the template is built")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "list built templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := template.List(dataDir)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCPUS\tMEMORY_MB\tDISK_MB\tBUILT")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", m.ID, m.CPUs, m.MemoryMB, m.DiskSizeMB, m.BuiltAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(build, ls)
	return cmd
}
