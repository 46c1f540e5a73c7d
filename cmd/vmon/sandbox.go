package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/store"
)

func sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Short: "inspect sandboxes, including ended ones and why they ended"}
	var dataDir string
	var all bool
	var limit int
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list sandboxes, newest first: running and paused ones, and with --all the ended ones with the reason they ended",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
			q := store.SandboxQuery{Desc: true, Limit: limit,
				States: []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePaused}}
			if all {
				q.States = nil
			}
			sbs, err := st.ListSandboxes(cmd.Context(), q)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTEMPLATE\tSTATE\tSTARTED\tENDED\tPAUSED DISK\tREASON")
			for _, sb := range sbs {
				tpl := sb.Alias
				if tpl == "" {
					tpl = sb.TemplateID
				}
				ended, reason, disk := "-", "-", "-"
				switch sb.State {
				case store.StateKilled:
					ended, reason = stamp(sb.KilledAt), sb.KillReason
				case store.StatePaused:
					kind := "memory+files"
					if !sb.PausedMemory {
						kind = "files"
					}
					disk = fmt.Sprintf("%.1f MiB (%s)", float64(sb.PausedBytes)/(1<<20), kind)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, tpl, sb.State, stamp(sb.StartedAt), ended, disk, reason)
			}
			return w.Flush()
		}),
	}
	config.BindDataDir(ls.Flags(), &dataDir)
	ls.Flags().BoolVarP(&all, "all", "a", false, "also list sandboxes that ended (killed, timed out, or stopped on their own)")
	ls.Flags().IntVar(&limit, "limit", 100, "list at most this many (0: all)")
	cmd.AddCommand(ls)
	return cmd
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
