package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/join"
	"github.com/vibemon/vmon/internal/secrets"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// clusterCADir, under the driver's data dir, holds the CA that signs the nodes' certificates.
const clusterCADir = "cluster-ca"

// gossipKeyFile, beside the cluster CA, is the key the cluster's gossip is encrypted with.
const gossipKeyFile = "gossip.key"

// clusterAuthority is the driver's join authority over its data dir: its cluster CA and gossip
// key (made on first use) and its store's tokens.
func clusterAuthority(ctx context.Context, dataDir string, st *store.Store) (*join.Authority, error) {
	if st.Shared() {
		// Drivers sharing a database are one authority: the first makes the CA and the gossip
		// key, the others use them.
		caPEM, err := st.SharedKey(ctx, "cluster-ca", func() ([]byte, error) { return tlsutil.NewCAPEM("vmon cluster CA") })
		if err != nil {
			return nil, fmt.Errorf("cluster CA: %w", err)
		}
		ca, err := tlsutil.CAFromPEM(caPEM)
		if err != nil {
			return nil, fmt.Errorf("cluster CA: %w", err)
		}
		key, err := st.SharedKey(ctx, "gossip-key", randomKey(32))
		if err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
		return &join.Authority{CA: ca, Tokens: st, GossipKey: key}, nil
	}
	dir := filepath.Join(dataDir, clusterCADir)
	ca, err := tlsutil.LoadOrCreateCA(dir, "vmon cluster CA")
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	key, err := secrets.LoadOrCreateRandom(filepath.Join(dir, gossipKeyFile), 32)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	return &join.Authority{CA: ca, Tokens: st, GossipKey: key}, nil
}

// randomKey makes n random bytes, for a shared key the first driver creates.
func randomKey(n int) func() ([]byte, error) {
	return func() ([]byte, error) {
		b := make([]byte, n)
		_, err := rand.Read(b)
		return b, err
	}
}

// secretsSealer returns the key secrets are sealed with: the database's when drivers share one
// (any of them must open what another sealed), else the data dir's.
func secretsSealer(ctx context.Context, dataDir string, st *store.Store) (*secrets.Sealer, error) {
	if !st.Shared() {
		return secrets.LoadOrCreateKey(filepath.Join(dataDir, secrets.KeyFile))
	}
	key, err := st.SharedKey(ctx, "secrets-key", randomKey(32))
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return secrets.NewSealer(key)
}

func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "the nodes of a cluster: tokens to join one, their list, drains"}
	var dataDir, apiURL, apiKey string
	var ttl time.Duration
	var uses int
	token := &cobra.Command{
		Use:   "join-token",
		Short: "print a token a node joins the cluster with (on the driver's host, or through its API with --api-url)",
		Long: "Prints a join token: a node given it (vmon serve --role node --join-token TOKEN) proves it to the\n" +
			"driver, checks the driver by the cluster CA the token pins, and gets its certificate for mutual TLS.\n" +
			"Only the token's hash is kept; it is good for --uses joins within --ttl. On the driver's host the token\n" +
			"is made in its data dir; elsewhere, --api-url (and --api-key) ask a running driver for one.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var tok string
			if apiURL != "" {
				t, err := remoteJoinToken(cmd, dataDir, apiURL, apiKey, ttl, uses)
				if err != nil {
					return err
				}
				tok = t
			} else {
				err := withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
					auth, err := clusterAuthority(cmd.Context(), dataDir, st)
					if err != nil {
						return err
					}
					t, err := auth.IssueToken(cmd.Context(), ttl, uses)
					tok = t.String()
					return err
				})(cmd, nil)
				if err != nil {
					return err
				}
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	config.BindDataDir(token.Flags(), &dataDir)
	token.Flags().DurationVar(&ttl, "ttl", join.DefaultTTL, "how long the token can be used")
	token.Flags().IntVar(&uses, "uses", 1, "how many nodes can join with it")
	token.Flags().StringVar(&apiURL, "api-url", "", "a running driver's API, to ask it for a token from another host")
	token.Flags().StringVar(&apiKey, "api-key", "", "API key for --api-url (default: <data-dir>/api-key)")
	cmd.AddCommand(token, nodeLsCmd(), nodeDrainCmd())
	return cmd
}

// remoteJoinToken asks the driver at apiURL for a token.
func remoteJoinToken(cmd *cobra.Command, dataDir, apiURL, apiKey string, ttl time.Duration, uses int) (string, error) {
	client, err := newAPIClient(dataDir, apiURL, apiKey, 30*time.Second)
	if err != nil {
		return "", err
	}
	body, _ := json.Marshal(joinTokenRequest{TTLSeconds: int64(ttl / time.Second), Uses: uses})
	req, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, client.base+joinTokensPath, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("X-API-Key", client.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.send(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out joinTokenResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return "", fmt.Errorf("the driver's answer: %w", err)
	}
	return out.Token, nil
}

// nodeRow is a node as `vmon node ls` shows it.
type nodeRow struct {
	Name         string    `json:"name"`
	Address      string    `json:"address"`
	Gossip       string    `json:"gossip,omitempty"`
	State        string    `json:"state"`
	Drain        string    `json:"drain,omitempty"`
	Features     []string  `json:"features"`
	FreeSlots    int       `json:"freeSlots"`
	FreeMemoryMB int64     `json:"freeMemoryMB"`
	FreeDiskMB   int64     `json:"freeDiskMB"`
	Load         float64   `json:"load"`
	Sandboxes    int       `json:"sandboxes"`
	Templates    []string  `json:"templates"`
	SeenAt       time.Time `json:"seenAt"`
	Since        time.Time `json:"since"`
}

func nodeLsCmd() *cobra.Command {
	var dataDir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls",
		Short: "list the cluster's nodes as the driver last saw them: address, state, features, room, sandboxes, templates",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
			nodes, err := st.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			sbs, err := st.ListSandboxes(cmd.Context(), store.SandboxQuery{States: []store.SandboxState{store.StateRunning}})
			if err != nil {
				return err
			}
			count := map[string]int{}
			for _, sb := range sbs {
				count[sb.NodeID]++
			}
			rows := make([]nodeRow, len(nodes))
			for i, n := range nodes {
				rows[i] = nodeRow{Name: n.Name, Address: n.RPC, Gossip: n.Gossip, State: n.State, Drain: n.Drain,
					Features: n.Features, FreeSlots: n.FreeSlots, FreeMemoryMB: n.FreeMemoryMB, FreeDiskMB: n.FreeDiskMB,
					Load: n.Load, Sandboxes: count[n.Name], Templates: n.Templates, SeenAt: n.SeenAt, Since: n.Since}
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), rows)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tADDRESS\tSTATE\tFEATURES\tFREE SLOTS\tFREE MEMORY\tFREE DISK\tLOAD\tSANDBOXES\tTEMPLATES\tSEEN")
			for _, r := range rows {
				state := r.State
				if r.Drain != store.DrainNone && state == store.NodeDraining {
					state += " (" + r.Drain + ")"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d MiB\t%d MiB\t%.2f\t%d\t%s\t%s\n", r.Name, r.Address, state,
					dash(strings.Join(r.Features, ",")), r.FreeSlots, r.FreeMemoryMB, r.FreeDiskMB, r.Load, r.Sandboxes,
					dash(strings.Join(r.Templates, ",")), stamp(r.SeenAt))
			}
			return w.Flush()
		}),
	}
	config.BindDataDir(c.Flags(), &dataDir)
	c.Flags().BoolVar(&asJSON, "json", false, "one JSON object per node")
	return c
}

func nodeDrainCmd() *cobra.Command {
	var dataDir string
	var pause, undo bool
	var wait time.Duration
	c := &cobra.Command{
		Use:   "drain NAME",
		Short: "stop placing sandboxes on a node; with --pause, also pause its running sandboxes so they resume elsewhere",
		Long: "Records the drain for the driver, which stops placing on the node at its next look (within seconds).\n" +
			"With --pause the driver pauses the node's running sandboxes, and this command waits until it did (--wait).\n" +
			"--undo ends a drain.",
		Args: cobra.ExactArgs(1),
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, args []string) error {
			name := args[0]
			mode := store.DrainStop
			switch {
			case undo:
				mode = store.DrainNone
			case pause:
				mode = store.DrainPause
			}
			if err := st.SetNodeDrain(cmd.Context(), name, mode); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if mode != store.DrainPause {
				fmt.Fprintf(out, "node %s: drain %s\n", name, map[bool]string{true: "ended", false: "recorded"}[undo])
				return nil
			}
			deadline := time.Now().Add(wait)
			for {
				sbs, err := st.ListSandboxes(cmd.Context(), store.SandboxQuery{States: []store.SandboxState{store.StateRunning}, NodeID: name})
				if err != nil {
					return err
				}
				if len(sbs) == 0 {
					fmt.Fprintf(out, "node %s: drained, no sandbox runs on it\n", name)
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("node %s: %d sandboxes still run on it after %s (is a driver running?)", name, len(sbs), wait)
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(time.Second):
				}
			}
		}),
	}
	config.BindDataDir(c.Flags(), &dataDir)
	c.Flags().BoolVar(&pause, "pause", false, "also pause the node's running sandboxes (they resume on any node with room)")
	c.Flags().BoolVar(&undo, "undo", false, "end the node's drain")
	c.Flags().DurationVar(&wait, "wait", 5*time.Minute, "with --pause, how long to wait for the sandboxes to be paused")
	return c
}
