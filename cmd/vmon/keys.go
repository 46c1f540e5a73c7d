package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/apikey"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/store"
)

func keysCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{Use: "keys", Short: "manage API keys (E2B_API_KEY values)"}
	config.BindDataDir(cmd.PersistentFlags(), &dataDir)

	var name string
	create := &cobra.Command{
		Use:   "create",
		Short: "create an API key and print it once",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
			rec, plain, err := st.CreateAPIKey(cmd.Context(), name, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s); it is shown only once:\n", rec.ID, rec.Mask)
			fmt.Fprintln(cmd.OutOrStdout(), plain)
			return nil
		}),
	}
	create.Flags().StringVar(&name, "name", "", "a name to recognise the key by")

	list := &cobra.Command{
		Use:   "list",
		Short: "list API keys (never their values)",
		Args:  cobra.NoArgs,
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, _ []string) error {
			keys, err := st.ListAPIKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tKEY\tCREATED\tSTATUS")
			for _, k := range keys {
				status := "active"
				if k.Revoked() {
					status = "revoked " + k.RevokedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Mask, k.CreatedAt.Format(time.RFC3339), status)
			}
			return tw.Flush()
		}),
	}

	revoke := &cobra.Command{
		Use:   "revoke ID|KEY",
		Short: "revoke an API key by its id or its value",
		Args:  cobra.ExactArgs(1),
		RunE: withStore(&dataDir, func(cmd *cobra.Command, st *store.Store, args []string) error {
			id := strings.TrimSpace(args[0])
			if apikey.WellFormed(id) {
				keys, err := st.ListAPIKeys(cmd.Context())
				if err != nil {
					return err
				}
				hash, found := apikey.Hash(id), false
				for _, k := range keys {
					if k.Hash == hash {
						id, found = k.ID, true
						break
					}
				}
				if !found {
					return fmt.Errorf("no such key")
				}
			}
			if err := st.RevokeAPIKey(cmd.Context(), id, time.Now()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", id)
			return nil
		}),
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// withStore opens the store of *dataDir (read when the command runs, after flag parsing) around fn.
func withStore(dataDir *string, fn func(*cobra.Command, *store.Store, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		// Drivers sharing a PostgreSQL database are told so by VMON_DATABASE (as `vmon serve
		// --database` may be); the commands that work on the records then work on it.
		open := func(ctx context.Context) (*store.Store, error) { return store.Open(ctx, *dataDir) }
		if dsn := os.Getenv("VMON_DATABASE"); dsn != "" {
			open = func(ctx context.Context) (*store.Store, error) { return store.OpenPostgres(ctx, dsn) }
		}
		st, err := open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		return fn(cmd, st, args)
	}
}
