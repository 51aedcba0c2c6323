package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

func (a *app) newStatsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats [--json] [--watch[=INTERVAL]]",
		Short: "show per-queue figures (--watch to refresh)",
		Long: `Shows, per queue: tasks ready, scheduled, running, retrying (waiting for
their next attempt) and dead; processed, failed, recovered and cancelled
counts since the queue was first used; how long the oldest ready task has
waited; when the next scheduled task is due; whether it is paused; its
flow control (LIMIT: slots in use/max_running, the rate, the per-key
limit and rate; "-" without any); and how many keys have tasks waiting in
their own lists (KEYS: ready counts tasks without a key). Below
the table: task types that workers gave back because they have no handler
for them while no live worker serves them (after unknown_type_grace,
unknown_type applies to their tasks), and queues with tasks waiting that
no live worker serves (a typo in --queue, or no worker started for it).
--watch refreshes every
INTERVAL (default 2s) until interrupted: in place on a terminal, as one
table after another (or one JSON document per line with --json) otherwise.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unexpected argument %s (an interval is given as --watch=<interval>)", safetext.Quote(args[0]))
			}
			return nil
		},
	}
	c := addCommon(cmd)
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	every := cmd.Flags().Duration("watch", 0, "refresh every `interval` (--watch alone: 2s) until interrupted")
	cmd.Flags().Lookup("watch").NoOptDefVal = "2s"
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if cmd.Flags().Changed("watch") && *every < 100*time.Millisecond {
			return a.usageError(cmd, "--watch %v: want an interval of at least 100ms, e.g. 5s", *every)
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		ctx, redraw := cmd.Context(), isTerminal(a.stdout)
		for {
			st, err := s.in.Queues(ctx) // every lane, merged
			var un []engine.UnservedType
			if err == nil {
				un, err = s.in.Unserved(ctx)
			}
			var unq []string
			if err == nil {
				unq = unservedQueues(ctx, s.in, st)
			}
			switch {
			case err != nil && ctx.Err() != nil:
				return nil
			case err != nil && *every == 0:
				return a.fail("stats", err)
			case err != nil: // keep watching through an outage
				fmt.Fprintf(a.stderr, "%s engine stats: %v\n", time.Now().Format("15:04:05"), err)
			case *asJSON && *every > 0:
				b, _ := json.Marshal(statsToJSON(st, un, unq))
				fmt.Fprintf(a.stdout, "%s\n", b)
			case *asJSON:
				return a.printJSON(statsToJSON(st, un, unq))
			case *every > 0:
				if redraw {
					fmt.Fprint(a.stdout, "\x1b[H\x1b[2J") // home, clear screen
				}
				fmt.Fprintf(a.stdout, "%s  every %v, namespace %s  (Ctrl-C to stop)\n\n",
					time.Now().Format("15:04:05"), *every, s.set.Engine.Namespace)
				printStats(safetext.Writer(a.stdout), st, un, unq)
				if !redraw {
					fmt.Fprintln(a.stdout)
				}
			default:
				printStats(safetext.Writer(a.stdout), st, un, unq)
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(*every):
			}
		}
	}
	return cmd
}

// statsJSON is what stats --json prints.
type statsJSON struct {
	Time   time.Time        `json:"time"`
	Queues []queueStatsJSON `json:"queues"`
	// Unserved lists task types given back while no live worker serves them.
	Unserved []engine.UnservedType `json:"unserved"`
	// UnservedQueues lists the queues with tasks waiting (ready,
	// scheduled or retrying) that no live worker serves.
	UnservedQueues []string `json:"unserved_queues"`
}

type queueStatsJSON struct {
	Queue            string     `json:"queue"`
	Ready            int64      `json:"ready"`
	Scheduled        int64      `json:"scheduled"`
	Running          int64      `json:"running"`
	Retrying         int64      `json:"retrying"`
	Dead             int64      `json:"dead"`
	Processed        int64      `json:"processed"`
	Failed           int64      `json:"failed"`
	Recovered        int64      `json:"recovered"`
	Cancelled        int64      `json:"cancelled"`
	Snoozed          int64      `json:"snoozed"`
	Expired          int64      `json:"expired"`
	Held             int64      `json:"held"`
	OldestReadyAgeMS int64      `json:"oldest_ready_age_ms"`
	NextDue          *time.Time `json:"next_due"`
	Paused           bool       `json:"paused"`
	MaxRunning       int64      `json:"max_running"`
	SlotsInUse       int64      `json:"slots_in_use"`
	Rate             string     `json:"rate,omitempty"`
	KeyMaxRunning    int64      `json:"key_max_running"`
	KeyRate          string     `json:"key_rate,omitempty"`
	KeysWaiting      int64      `json:"keys_waiting"`
}

func statsToJSON(st []engine.QueueInfo, un []engine.UnservedType, unq []string) statsJSON {
	out := statsJSON{Time: time.Now().UTC(), Queues: []queueStatsJSON{}, Unserved: []engine.UnservedType{},
		UnservedQueues: append([]string{}, unq...)}
	out.Unserved = append(out.Unserved, un...)
	for _, q := range st {
		j := queueStatsJSON{Queue: q.Queue, Ready: q.Ready, Scheduled: q.Scheduled, Running: q.Running,
			Retrying: q.Retrying, Dead: q.Dead, Processed: q.Processed, Failed: q.Failed,
			Recovered: q.Recovered, Cancelled: q.Cancelled, Snoozed: q.Snoozed, Expired: q.Expired, Held: q.Held, OldestReadyAgeMS: q.Latency.Milliseconds(), Paused: q.Paused,
			MaxRunning: q.MaxRunning, SlotsInUse: q.SlotsInUse,
			Rate: q.Rate, KeyMaxRunning: q.KeyMaxRunning, KeyRate: q.KeyRate, KeysWaiting: q.KeysWaiting}
		if !q.NextDue.IsZero() {
			t := q.NextDue.UTC()
			j.NextDue = &t
		}
		out.Queues = append(out.Queues, j)
	}
	return out
}

func printStats(w io.Writer, st []engine.QueueInfo, un []engine.UnservedType, unq []string) {
	if len(st) == 0 {
		fmt.Fprintln(w, "no queues yet: nothing was ever enqueued in this namespace")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tREADY\tSCHEDULED\tRUNNING\tRETRYING\tDEAD\tPROCESSED\tFAILED\tRECOVERED\tCANCELLED\tSNOOZED\tEXPIRED\tHELD\tOLDEST READY\tNEXT DUE\tPAUSED\tLIMIT\tKEYS")
	for _, q := range st {
		oldest, next, paused := "-", "-", "no"
		var lims []string
		if q.MaxRunning > 0 {
			lims = append(lims, fmt.Sprintf("%d/%d", q.SlotsInUse, q.MaxRunning))
		}
		if q.Rate != "" {
			lims = append(lims, "rate "+q.Rate)
		}
		if q.KeyMaxRunning > 0 {
			lims = append(lims, fmt.Sprintf("key %d", q.KeyMaxRunning))
		}
		if q.KeyRate != "" {
			lims = append(lims, "key rate "+q.KeyRate)
		}
		limit := "-"
		if len(lims) > 0 {
			limit = strings.Join(lims, ", ")
		}
		if q.Paused {
			paused = "yes"
		}
		if q.Ready > 0 {
			oldest = q.Latency.Round(time.Millisecond).String()
		}
		if !q.NextDue.IsZero() {
			next = fmt.Sprintf("%s (%s)", q.NextDue.Local().Format("2006-01-02 15:04:05"), relative(q.NextDue, time.Now()))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\n", q.Queue, q.Ready, q.Scheduled, q.Running,
			q.Retrying, q.Dead, q.Processed, q.Failed, q.Recovered, q.Cancelled, q.Snoozed, q.Expired, q.Held, oldest, next, paused, limit, q.KeysWaiting)
	}
	tw.Flush()
	if len(un) > 0 {
		fmt.Fprintln(w, "\ntask types no live worker serves (given back since):")
		for _, u := range un {
			fmt.Fprintf(w, "  queue %s, type %q (%s, %s)\n", u.Queue, u.Type,
				u.Since.Local().Format("2006-01-02 15:04:05"), relative(u.Since, time.Now()))
		}
	}
	if len(unq) > 0 {
		fmt.Fprintln(w, "\nqueues no live worker serves (their tasks wait until one does):")
		for _, q := range unq {
			fmt.Fprintf(w, "  %s\n", q)
		}
	}
}

// servedQueues lists the queues the live workers serve, sorted; nil when
// the workers could not be read.
func servedQueues(ctx context.Context, in *engine.Inspector) ([]string, error) {
	ws, err := in.Workers(ctx)
	if err != nil {
		return nil, err
	}
	served := []string{}
	for _, w := range ws {
		if w.Alive {
			served = append(served, w.Queues...)
		}
	}
	slices.Sort(served)
	return slices.Compact(served), nil
}

// unservedQueues lists the queues of st with tasks waiting that no live
// worker serves; nothing when the workers could not be read (the hint is
// left out, stats goes on).
func unservedQueues(ctx context.Context, in *engine.Inspector, st []engine.QueueInfo) []string {
	served, err := servedQueues(ctx, in)
	if err != nil {
		return nil
	}
	var out []string
	for _, q := range st {
		if q.Ready+q.Scheduled+q.Retrying > 0 && !slices.Contains(served, q.Queue) {
			out = append(out, q.Queue)
		}
	}
	return out
}

func (a *app) newDeadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead list|retry|purge",
		Short: "list, retry or purge dead letters",
		Long: `Manages dead letters: tasks that failed max_attempts times, failed
permanently, or had no handler (unknown_type: dead).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want list, retry or purge")
		},
	}
	list := &cobra.Command{Use: "list [--json] [--offset N] [--limit N]", Short: "list dead letters, newest first (with shards: lane after lane), with the last error", Args: cobra.NoArgs}
	c := addCommon(list)
	asJSON := list.Flags().Bool("json", false, "print JSON")
	offset := list.Flags().Int("offset", 0, "skip this many")
	limit := list.Flags().Int("limit", 50, "show at most this many")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if *offset < 0 || *limit < 1 {
			return a.usageError(cmd, "want --offset 0 or more and --limit 1 or more")
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		return a.deadList(cmd, s, *offset, *limit, *asJSON)
	}
	cmd.AddCommand(list, a.deadOp("retry", "put one back at the front of its queue, attempts reset (--all: every one)"),
		a.deadOp("purge", "delete one (--all: every one)"))
	return cmd
}

// deadOp is dead retry or dead purge: of one task or, with --all, of all.
func (a *app) deadOp(verb, short string) *cobra.Command {
	cmd := &cobra.Command{Use: verb + " ID|--all", Short: short, Args: cobra.MaximumNArgs(1)}
	c := addCommon(cmd)
	all := cmd.Flags().Bool("all", false, verb+" every dead letter")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *all == (len(args) == 1) {
			return a.usageError(cmd, "want one task id or --all")
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		ctx, done := cmd.Context(), map[string]string{"retry": "retried", "purge": "purged"}[verb]
		act := engine.ActionRetry
		if verb == "purge" {
			act = engine.ActionDelete
		}
		if *all {
			// The action applies only to the tasks still dead when their
			// batch is written.
			res, err := s.in.ActAll(ctx, act, engine.Filter{State: engine.StateDead})
			if err != nil {
				if res.Done > 0 {
					fmt.Fprintf(a.stdout, "%s %d dead letters before the error\n", done, res.Done)
				}
				return a.fail("dead "+verb, err)
			}
			fmt.Fprintf(a.stdout, "%s %d dead letters\n", done, res.Done)
			return nil
		}
		if err := deadOne(ctx, s.in, act, verb, args[0]); err != nil {
			return a.fail("dead "+verb, err)
		}
		fmt.Fprintf(a.stdout, "%s %s\n", done, args[0])
		return nil
	}
	return cmd
}

// refusal is an error of the CLI's own wording that matches an engine
// error (ErrNotFound, errNotDead) for the exit code.
type refusal struct {
	msg  string
	kind error
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.kind }

// deadOne applies act (retry or delete) to task id if it is a dead
// letter. A task that is not dead is refused (errNotDead) and left as it
// is, one that does not exist too (ErrNotFound): the inspector's actions
// apply to other states as well (delete to any), so the state is read
// first and the action is asked only of a dead task.
// errNotDead: a dead-letter command named a task that is not dead.
var errNotDead = errors.New("not a dead letter")

func deadOne(ctx context.Context, in *engine.Inspector, act engine.Action, verb, id string) error {
	notFound := &refusal{fmt.Sprintf("cannot %s dead letter %s: there is no such task", verb, id), engine.ErrNotFound}
	notDead := func(state engine.State) error {
		return &refusal{fmt.Sprintf("cannot %s dead letter %s: the task is not dead (it is %s)", verb, id, state), errNotDead}
	}
	tv, err := in.Task(ctx, id)
	switch {
	case errors.Is(err, engine.ErrNotFound) && !errors.Is(err, engine.ErrInvalid):
		return notFound
	case err != nil:
		return err
	case tv.State != engine.StateDead:
		return notDead(tv.State)
	}
	res, err := in.Act(ctx, act, id)
	switch {
	case err != nil:
		return err
	case res.Done == 1:
		return nil
	case res.Missing > 0:
		return notFound // purged meanwhile
	}
	// Skipped: it left the dead letters meanwhile.
	if tv, err := in.Task(ctx, id); err == nil {
		return notDead(tv.State)
	}
	return notDead("no longer dead")
}

func (a *app) deadList(cmd *cobra.Command, s *session, offset, limit int, asJSON bool) error {
	tasks, total, err := deadLetters(cmd.Context(), s.in, offset, limit)
	if err != nil {
		return a.fail("dead list", err)
	}
	if asJSON {
		out := make([]taskJSON, len(tasks))
		for i, t := range tasks {
			out[i] = taskToJSON(t)
		}
		return a.printJSON(out)
	}
	tw := tabwriter.NewWriter(safetext.Writer(a.stdout), 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tQUEUE\tTYPE\tATTEMPTS\tDIED\tLAST ERROR")
	for _, t := range tasks {
		died := "-"
		if !t.Finished.IsZero() {
			died = t.Finished.Local().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", t.ID, t.Queue, t.Type, t.Attempts, t.MaxAttempts, died, clip(firstLine(t.LastError), 80))
	}
	tw.Flush()
	fmt.Fprintf(a.stdout, "%d shown of %d dead letters\n", len(tasks), total)
	return nil
}

// deadLetters lists limit dead letters of every queue from offset, newest
// first (with shards, lane after lane, each lane's newest first), and how
// many there are. It pages through the inspector's listing, reading the
// offset tasks it skips.
// maxPage is the largest page ListTasks returns (ListOptions.Limit).
const maxPage = 1000

func deadLetters(ctx context.Context, in *engine.Inspector, offset, limit int) ([]*engine.TaskInfo, int64, error) {
	var (
		out   []*engine.TaskInfo
		total int64
	)
	opts := engine.ListOptions{Filter: engine.Filter{State: engine.StateDead}}
	for first := true; first || opts.Cursor != ""; first = false {
		opts.Limit = min(offset+limit-len(out), maxPage)
		page, err := in.ListTasks(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		if first {
			total = page.Total
		}
		for _, t := range page.Tasks {
			if offset > 0 {
				offset--
				continue
			}
			out = append(out, t)
		}
		if len(out) >= limit {
			return out[:limit], total, nil
		}
		opts.Cursor = page.Next
	}
	return out, total, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
