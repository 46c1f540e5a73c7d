package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/doctor"
	"github.com/vibemon/vmon/internal/limits"
	"github.com/vibemon/vmon/internal/template"
)

// runscPin is the gVisor release vmon is tested with (scripts/install-runsc.sh installs it).
const runscPin = "160fafc42237"

func doctorCmd() *cobra.Command {
	var dataDir, runsc, envd string
	var diskMB, maxTasks, maxFiles int
	var rootImages bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "check what this host needs to run vmon, and how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if envd == "" {
				envd = defaultEnvdPath()
			}
			m, err := template.Load(dataDir, "base")
			results := doctor.Run(cmd.Context(), doctor.Options{
				DataDir: dataDir, RunscPath: runsc, RunscVersion: runscPin, EnvdPath: envd,
				TemplateReady: err == nil, MemoryMB: m.MemoryMB, DiskMB: diskMB,
				Limits: limits.Overrides{Tasks: maxTasks, Files: maxFiles}, RootImages: rootImages,
			})
			if !doctor.Print(cmd.OutOrStdout(), results) {
				return errors.New("some checks failed")
			}
			return nil
		},
	}
	config.BindDataDir(cmd.Flags(), &dataDir)
	cmd.Flags().StringVar(&runsc, "runsc", "runsc", "path of the runsc binary")
	cmd.Flags().StringVar(&envd, "envd-path", "", "envd binary (default: envd beside the vmon binary)")
	cmd.Flags().IntVar(&diskMB, "sandbox-disk-mb", config.DefaultSandboxDiskMB, "as for vmon serve: the disk limit to check")
	cmd.Flags().BoolVar(&rootImages, "root-images", true, "as for vmon serve: whether mkfs.erofs is required")
	cmd.Flags().IntVar(&maxTasks, "sandbox-max-tasks", 0, "as for vmon serve")
	cmd.Flags().IntVar(&maxFiles, "sandbox-max-files", 0, "as for vmon serve")
	return cmd
}
