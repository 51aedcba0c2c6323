package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

// checkJSON is the report as `engine check --json` prints it.
type checkJSON struct {
	Tasks       int           `json:"tasks"`
	Queues      int           `json:"queues"`
	Findings    []findingJSON `json:"findings"`
	Unconfirmed []findingJSON `json:"unconfirmed"`
	InMotion    int           `json:"in_motion"`
	Repaired    int           `json:"repaired"`
	Remaining   []findingJSON `json:"remaining,omitempty"`
	Memory      memoryJSON    `json:"redis_memory"`
}

// memoryJSON is the Redis server's memory limit and eviction policy.
type memoryJSON struct {
	MaxMemory int64  `json:"maxmemory"`
	Policy    string `json:"policy,omitempty"`
	Unknown   string `json:"unknown,omitempty"`
	Summary   string `json:"summary"`
}

type findingJSON struct {
	Kind     string   `json:"kind"`
	Queue    string   `json:"queue,omitempty"`
	TaskID   string   `json:"task_id,omitempty"`
	Key      string   `json:"key,omitempty"`
	Places   []string `json:"places,omitempty"`
	Gauge    string   `json:"gauge,omitempty"`
	Stored   *int64   `json:"stored,omitempty"`
	Counted  *int64   `json:"counted,omitempty"`
	Message  string   `json:"message"`
	Repaired bool     `json:"repaired,omitempty"`
}

func findingsJSON(fs []engine.CheckFinding) []findingJSON {
	out := make([]findingJSON, len(fs))
	for i, f := range fs {
		out[i] = findingJSON{Kind: f.Kind, Queue: f.Queue, TaskID: f.TaskID, Key: f.Key, Places: f.Places,
			Gauge: f.Gauge, Message: f.Message, Repaired: f.Repaired}
		if f.Kind == "gauge" {
			out[i].Stored, out[i].Counted = &fs[i].Stored, &fs[i].Counted
		}
	}
	return out
}

// runCheck is `engine check [--repair] [--json]`: it checks the namespace
// of in (every lane of it), repairs what it can when repair is set, and
// prints the report to out, as a table or as JSON. It returns the number
// of findings that remain (after repair, what a fresh check still finds);
// the command exits non-zero when that is not zero, or when err is not
// nil. A lane that cannot be checked makes err name it; the report of the
// other lanes is printed all the same.
func runCheck(ctx context.Context, in *engine.Inspector, repair, asJSON bool, out io.Writer) (findings int, err error) {
	rep, checkErr := in.Check(ctx, engine.CheckOptions{Repair: repair})
	if rep == nil {
		return 0, checkErr
	}
	remaining := rep.Findings
	if repair && rep.Remaining != nil {
		remaining = rep.Remaining
	}
	mem, memErr := in.MemoryPolicy(ctx)
	if checkErr == nil && memErr != nil {
		return len(remaining), memErr
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		j := checkJSON{Tasks: rep.Tasks, Queues: rep.Queues, Findings: findingsJSON(rep.Findings),
			Unconfirmed: findingsJSON(rep.Unconfirmed), InMotion: rep.InMotion, Repaired: rep.Repaired,
			Memory: memoryJSON{MaxMemory: mem.MaxMemory, Policy: mem.Policy, Unknown: mem.Unknown, Summary: mem.String()}}
		if rep.Remaining != nil {
			j.Remaining = findingsJSON(rep.Remaining)
		}
		if err := enc.Encode(j); err != nil {
			return len(remaining), err
		}
		return len(remaining), checkErr
	}
	fmt.Fprintf(out, "checked %d tasks in %d queues\n", rep.Tasks, rep.Queues)
	fmt.Fprintf(out, "redis memory: %s\n", mem)
	switch {
	case len(rep.Findings) > 0:
		fmt.Fprintf(out, "%d %s:\n", len(rep.Findings), checkPlural(len(rep.Findings), "finding", "findings"))
		printFindings(out, rep.Findings, repair)
	case checkErr != nil:
		fmt.Fprintln(out, "no findings in the lanes that could be checked")
	default:
		fmt.Fprintln(out, "no findings")
	}
	if len(rep.Unconfirmed) > 0 {
		fmt.Fprintf(out, "%d possible %s could not be confirmed: the keys concerned kept changing (run the check again):\n",
			len(rep.Unconfirmed), checkPlural(len(rep.Unconfirmed), "finding", "findings"))
		printFindings(out, rep.Unconfirmed, false)
	}
	if repair && rep.Remaining != nil {
		fmt.Fprintf(out, "repaired %d; a fresh check finds %d\n", rep.Repaired, len(rep.Remaining))
		if len(rep.Remaining) > 0 {
			printFindings(out, rep.Remaining, false)
		}
	}
	return len(remaining), checkErr
}

func printFindings(out io.Writer, fs []engine.CheckFinding, repair bool) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, f := range fs {
		mark := ""
		if repair {
			mark = "not repaired"
			if f.Repaired {
				mark = "repaired"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Kind, f.Message, mark)
	}
	tw.Flush()
}

func checkPlural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func (a *app) newCheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check [--repair] [--json]",
		Short: "check the namespace's consistency; --repair fixes what it can",
		Long: `Walks the namespace, recounts every gauge from the structures, and reports
tasks found in no place or in two, orphan buckets, stale or unparsable index
members, keys of the wrong type and unregistered workers. With --repair it fixes
the gauges and re-homes orphans, each repair one optimistic transaction, safe
beside running workers. Uses KEYS on the namespace (O(keys in the database)):
run it off-peak on a large database. Exits 6 when findings remain.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd)
	repair := cmd.Flags().Bool("repair", false, "fix the gauges and re-home orphans")
	asJSON := cmd.Flags().Bool("json", false, "print the report as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		n, err := runCheck(cmd.Context(), s.in, *repair, *asJSON, safetext.Writer(a.stdout))
		if err != nil {
			return a.fail("check", err)
		}
		if n > 0 {
			return exitCode(exitFindings)
		}
		return nil
	}
	return cmd
}
