package main

import (
	"fmt"
	"path/filepath"
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
func clusterAuthority(dataDir string, st *store.Store) (*join.Authority, error) {
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

func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "the nodes of a cluster: tokens to join one"}
	var dataDir string
	var ttl time.Duration
	var uses int
	token := &cobra.Command{
		Use:   "join-token",
		Short: "print a token a node joins the cluster with (run on the driver's host)",
		Long: "Prints a join token: a node given it (vmon serve --role node --join-token TOKEN) proves it to the\n" +
			"driver, checks the driver by the cluster CA the token pins, and gets its certificate for mutual TLS.\n" +
			"Only the token's hash is kept; it is good for --uses joins within --ttl.",
		Args: cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
			auth, err := clusterAuthority(dataDir, st)
			if err != nil {
				return err
			}
			t, err := auth.IssueToken(cmd.Context(), ttl, uses)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), t.String())
			return err
		}),
	}
	config.BindDataDir(token.Flags(), &dataDir)
	token.Flags().DurationVar(&ttl, "ttl", join.DefaultTTL, "how long the token can be used")
	token.Flags().IntVar(&uses, "uses", 1, "how many nodes can join with it")
	cmd.AddCommand(token)
	return cmd
}
