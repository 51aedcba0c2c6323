package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/spf13/cobra"
)

// shardsJSON is what shards --json prints.
type shardsJSON struct {
	Namespace  string           `json:"namespace"`
	MapVersion int              `json:"map_version"`
	Lanes      []laneStatusJSON `json:"lanes"`
}

type laneStatusJSON struct {
	engine.LaneStatus
	Server string `json:"server"`
}

func (a *app) newShardsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "shards [--json]",
		Short: "show each lane (logical shard): its server, role, reachability, sizes and map version",
		Long: `Reads every lane of the shard map (shards.lanes) at once and shows, per lane,
the server it lives on, the server's replication role, whether it answered and
how fast, the shard-map version stored in the lane (the version of the map that
last moved it; "-" when it never moved), its task counts and live workers.
A lane whose map version is above shards.version has moved since this config
was written: processes with this config cannot write to it. Without shards
configured it shows the one lane on redis.addr. Exits 1 when a lane cannot be
reached. docs/scaling.md has the procedures.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd)
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
		defer cancel()
		sts := s.in.LaneStatuses(ctx)
		out := shardsJSON{Namespace: s.set.Engine.Namespace, MapVersion: s.set.Shards.Version}
		down := 0
		for _, st := range sts {
			server := s.set.Redis.Addr
			if st.Lane < len(s.set.Shards.Lanes) {
				server = s.set.Shards.Lanes[st.Lane]
			}
			out.Lanes = append(out.Lanes, laneStatusJSON{LaneStatus: st, Server: server})
			if !st.Reachable {
				down++
			}
		}
		if *asJSON {
			if err := a.printJSON(out); err != nil {
				return err
			}
		} else {
			printShards(a, out)
		}
		if down > 0 {
			return exitCode(exitFailure)
		}
		return nil
	}
	return cmd
}

func printShards(a *app, out shardsJSON) {
	ver := "off"
	if out.MapVersion > 0 {
		ver = fmt.Sprint(out.MapVersion)
	}
	fmt.Fprintf(a.stdout, "namespace %s, %d lanes, shard map version %s\n\n", out.Namespace, len(out.Lanes), ver)
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tSERVER\tROLE\tREACHABLE\tROUND TRIP\tMAP\tREADY\tSCHEDULED\tRUNNING\tDEAD\tWORKERS\t")
	for _, l := range out.Lanes {
		reach, rt, mv := "yes", l.RoundTrip.Round(10*time.Microsecond).String(), "-"
		if !l.Reachable {
			reach, rt = "NO", "-"
		}
		if l.MapVersion > 0 {
			mv = fmt.Sprint(l.MapVersion)
			if out.MapVersion > 0 && l.MapVersion > int64(out.MapVersion) {
				mv += " (newer: this config is stale)"
			}
		}
		role := l.Role
		if role == "" {
			role = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\n", l.Lane, l.Server, role, reach, rt, mv,
			l.Ready, l.Scheduled, l.Running, l.Dead, l.Workers)
	}
	tw.Flush()
	for _, l := range out.Lanes {
		if l.Err != "" {
			fmt.Fprintf(a.stdout, "lane %d: %s\n", l.Lane, l.Err)
		}
	}
}
