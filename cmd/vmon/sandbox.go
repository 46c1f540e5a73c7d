package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/node"
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
	cmd.AddCommand(ls, deniedCmd(), sandboxLogsCmd())
	return cmd
}

// deniedCmd is `vmon sandbox denied ID [--follow]`: what the node refused a running sandbox, from
// the API's stream (GET /sandboxes/{id}/network/denied).
func deniedCmd() *cobra.Command {
	var dataDir, apiURL, apiKey string
	var follow bool
	c := &cobra.Command{
		Use:   "denied ID",
		Short: "show what the network policy refused a running sandbox (repeats within a few seconds are counted on one line)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := newAPIClient(dataDir, apiURL, apiKey, 0)
			if err != nil {
				return err
			}
			path := "/sandboxes/" + url.PathEscape(args[0]) + "/network/denied"
			if !follow {
				path += "?follow=false"
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, client.base+path, nil)
			if err != nil {
				return err
			}
			req.Header.Set("X-API-Key", client.key)
			resp, err := client.send(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				var e node.DeniedEvent
				if err := json.Unmarshal([]byte(data), &e); err != nil {
					return fmt.Errorf("unreadable event %q: %w", data, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), formatDenied(e))
			}
			if err := sc.Err(); err != nil && cmd.Context().Err() == nil {
				return err
			}
			return nil
		},
	}
	config.BindDataDir(c.Flags(), &dataDir)
	c.Flags().StringVar(&apiURL, "api-url", "http://127.0.0.1:3000", "API of the running `vmon serve`")
	c.Flags().StringVar(&apiKey, "api-key", "", "API key (default: <data-dir>/api-key)")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing refusals as they happen")
	return c
}

// formatDenied prints one refusal the way scudo does: what, where, why, how often.
func formatDenied(e node.DeniedEvent) string {
	dst := e.Dst
	if e.Port != 0 {
		dst = net.JoinHostPort(e.Dst, strconv.Itoa(int(e.Port)))
	}
	if e.Name != "" {
		dst = e.Name + " (" + dst + ")"
	}
	line := fmt.Sprintf("%s  blocked %s %s  [%s", e.Time.UTC().Format(time.RFC3339), e.Proto, dst, e.Stage)
	if e.Rule != "" {
		line += " " + e.Rule
	}
	line += "]"
	if e.Repeats {
		line += fmt.Sprintf(" (%d more)", e.Count)
	}
	return line
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
