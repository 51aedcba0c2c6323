package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bucketq/bucketq/internal/safetext"
)

func (a *app) newPeriodicCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "periodic",
		Short: "periodic entries (see the periodic: key of the configuration)",
	}
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "show each periodic entry: schedule, next and last firing, whether a live process declares it",
		Long: `Shows every periodic entry stored in the namespace: its schedule, the
firing time up to which it is enqueued, its next firing, its last firing
and that task's state, and how many live processes declare it. An entry
no live process declares is ORPHANED: its firings stop after its horizon.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(list)
	asJSON := list.Flags().Bool("json", false, "print JSON")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		ls, err := s.in.Periodics(cmd.Context()) // lane 0's with shards: they live there
		if err != nil {
			return a.fail("periodic list", err)
		}
		if *asJSON {
			b, err := json.MarshalIndent(ls, "", "  ")
			if err != nil {
				return a.fail("periodic list", err)
			}
			fmt.Fprintf(safetext.Writer(a.stdout), "%s\n", b)
			return nil
		}
		tw := tabwriter.NewWriter(safetext.Writer(a.stdout), 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSCHEDULE\tTYPE\tQUEUE\tMISSED\tNEXT\tLAST\tLAST STATE\tDECLARED BY")
		for _, p := range ls {
			sched := p.Every
			if p.Cron != "" {
				sched = p.Cron
				if p.Location != "" {
					sched += " (" + p.Location + ")"
				}
			}
			if p.Invalid != "" {
				sched = "invalid: " + p.Invalid
			}
			decl := fmt.Sprintf("%d live", p.Declarers)
			if p.Orphaned {
				decl = "ORPHANED"
			}
			state := string(p.LastState)
			if state == "" {
				state = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, sched, p.Type, p.Queue, p.Missed,
				periodicTime(p.Next), periodicTime(p.Last), state, decl)
		}
		return tw.Flush()
	}
	cmd.AddCommand(list)
	return cmd
}

func periodicTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
