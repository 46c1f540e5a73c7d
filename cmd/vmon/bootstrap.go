package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/join"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/store"
)

// The driver's bootstrap for deployments no one types commands into (a Helm chart): the join
// token nodes use (--bootstrap-token-file) and the admin API key (--admin-key-file) from files (its
// Secrets), and the other drivers' gossip (--gossip-join, its headless Service).

// driverAdminKey is the admin key a driver prints: with --admin-key-file, that key made valid in
// the store, printed as where it is (logs are not where a key goes); else the data dir's, made at
// first start.
func driverAdminKey(ctx context.Context, st *store.Store, c *config.Serve) (string, error) {
	if c.AdminKeyFile == "" {
		return ensureAdminKey(ctx, st, c.DataDir)
	}
	plain, err := config.ReadSecretFile("--admin-key-file", c.AdminKeyFile)
	if err != nil {
		return "", err
	}
	if _, err := st.EnsureAPIKey(ctx, "admin (--admin-key-file)", plain, time.Now()); err != nil {
		return "", fmt.Errorf("--admin-key-file %s: %w (a revoked key stays revoked: put a new key in the file)", c.AdminKeyFile, err)
	}
	// What the start prints in its place, as it does for a key it does not have.
	return "<the key in " + c.AdminKeyFile + ">", nil
}

// ensureBootstrapToken makes --bootstrap-token-file's token one nodes can join with, any number
// of times, replacing an earlier one.
func ensureBootstrapToken(ctx context.Context, auth *join.Authority, c *config.Serve) error {
	if c.BootstrapTokenFile == "" {
		return nil
	}
	s, err := config.ReadSecretFile("--bootstrap-token-file", c.BootstrapTokenFile)
	if err != nil {
		return err
	}
	tok, err := join.ParseToken(s)
	if err != nil {
		return fmt.Errorf("--bootstrap-token-file %s: %w", c.BootstrapTokenFile, err)
	}
	if err := auth.EnsureBootstrapToken(ctx, tok); err != nil {
		return fmt.Errorf("--bootstrap-token-file %s: %w", c.BootstrapTokenFile, err)
	}
	return nil
}

// driversJoinEvery is how often a driver with --gossip-join and no other driver in sight joins
// those addresses again (the others may start later, or a partition healed).
const driversJoinEvery = 10 * time.Second

// keepDriversJoined joins the gossip at --gossip-join at start and whenever no other driver is in
// sight, so that the cluster's drivers find each other (nodes join the gossip through whichever
// driver answered them; without this, drivers started apart would each gossip with their own).
func keepDriversJoined(ctx context.Context, cl *membership.Cluster, c *config.Serve, log *slog.Logger) {
	if len(c.GossipJoin) == 0 {
		return
	}
	for {
		if !otherDriverInSight(cl, c.Name) {
			if n, err := cl.Join(c.GossipJoin); err != nil {
				log.Debug("joining the drivers' gossip", "seeds", c.GossipJoin, "err", err)
			} else {
				log.Debug("joined the drivers' gossip", "seeds", c.GossipJoin, "answered", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(driversJoinEvery):
		}
	}
}

func otherDriverInSight(cl *membership.Cluster, self string) bool {
	for _, m := range cl.Members() {
		if m.Alive && m.Name != self && m.Meta.Role == membership.RoleDriver {
			return true
		}
	}
	return false
}
