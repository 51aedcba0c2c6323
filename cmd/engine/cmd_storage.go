package main

import (
	"fmt"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

func (a *app) newStorageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "storage [compact|legacy]",
		Short: "show or set the namespace's storage format",
		Long: `Shows the namespace's storage format, or sets it. Clients and workers
that set neither compact_records nor legacy_records follow it: on a namespace
marked compact they write the compact storage (shorter task records, and a
task alone in its bucket scheduled without a list), otherwise the storage
every release reads. A new namespace is marked compact by the first client
or worker of this release; one that was in use before is not.

"compact" marks the namespace (every lane, with shards): run it once every
process on the namespace runs this release or a later one, since earlier
releases read neither form. Running processes take it up within their
format_recheck (a minute by default).
"legacy" removes the mark: processes started from then on write the storage
every release reads; running ones that already write the compact storage go
on until they restart. Everything written either way stays readable.`,
		Args: cobra.MaximumNArgs(1),
	}
	c := addCommon(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		set := len(args) == 1
		if set && args[0] != "compact" && args[0] != "legacy" {
			return a.usageError(cmd, "want compact or legacy, not %s", safetext.Quote(args[0]))
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		if set {
			if err := s.tasks().SetStorageFormat(cmd.Context(), args[0] == "compact"); err != nil {
				return a.fail("storage", err)
			}
		}
		v, err := s.tasks().StorageFormat(cmd.Context())
		if err != nil {
			return a.fail("storage", err)
		}
		if v >= engine.CompactStorage {
			fmt.Fprintf(a.stdout, "storage: compact (version %d)\n", v)
		} else {
			fmt.Fprintln(a.stdout, "storage: legacy (not marked: the storage every release reads)")
		}
		return nil
	}
	return cmd
}
