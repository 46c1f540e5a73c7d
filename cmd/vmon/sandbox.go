package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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
	var all, asJSON bool
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
			nodes, err := st.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			nodeOf := map[string]store.Node{}
			for _, n := range nodes {
				nodeOf[n.Name] = n
			}
			rows := make([]sandboxRow, len(sbs))
			for i, sb := range sbs {
				rows[i] = rowOf(sb, nodeOf)
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), rows)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTEMPLATE\tSTATE\tNODE\tSTARTED\tENDED\tPAUSED DISK\tREASON")
			for _, r := range rows {
				disk := "-"
				if r.PausedBytes > 0 || r.State == string(store.StatePaused) {
					disk = fmt.Sprintf("%.1f MiB (%s)", float64(r.PausedBytes)/(1<<20), r.PausedKind)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Template, r.State, dash(r.Node), stamp(r.StartedAt),
					stampPtr(r.EndedAt), disk, dash(r.Reason))
			}
			return w.Flush()
		}),
	}
	config.BindDataDir(ls.Flags(), &dataDir)
	ls.Flags().BoolVarP(&all, "all", "a", false, "also list sandboxes that ended (killed, timed out, or stopped on their own)")
	ls.Flags().IntVar(&limit, "limit", 100, "list at most this many (0: all)")
	ls.Flags().BoolVar(&asJSON, "json", false, "one JSON object per sandbox, with its node")
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

// sandboxRow is a sandbox as `vmon sandbox ls` shows it.
type sandboxRow struct {
	ID          string     `json:"sandboxId"`
	Template    string     `json:"template"`
	State       string     `json:"state"`
	Node        string     `json:"node,omitempty"`
	StartedAt   time.Time  `json:"startedAt"`
	EndedAt     *time.Time `json:"endedAt,omitempty"`
	PausedBytes int64      `json:"pausedBytes,omitempty"`
	PausedKind  string     `json:"pausedKind,omitempty"`
	Reason      string     `json:"reason,omitempty"`
}

// rowOf describes sb; a running sandbox whose node is out of reach is shown as unreachable, with
// since when.
func rowOf(sb store.Sandbox, nodes map[string]store.Node) sandboxRow {
	r := sandboxRow{ID: sb.ID, Template: sb.Alias, State: string(sb.State), Node: sb.NodeID, StartedAt: sb.StartedAt}
	if r.Template == "" {
		r.Template = sb.TemplateID
	}
	switch sb.State {
	case store.StateKilled:
		at := sb.KilledAt
		r.EndedAt, r.Reason = &at, sb.KillReason
	case store.StatePaused:
		r.PausedBytes, r.PausedKind = sb.PausedBytes, "memory+files"
		if !sb.PausedMemory {
			r.PausedKind = "files"
		}
	case store.StateRunning:
		if n, ok := nodes[sb.NodeID]; ok && (n.State == store.NodeLost || n.State == store.NodeLeft) {
			r.State = "unreachable"
			r.Reason = fmt.Sprintf("node %s %s since %s", n.Name, n.State, stamp(n.Since))
		}
	}
	return r
}

// writeJSONLines writes one JSON object per line, for scripts.
func writeJSONLines[T any](w io.Writer, rows []T) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
