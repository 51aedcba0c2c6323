package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

// newInspectCmds are the inspector's commands: tasks, workers, queues.
func (a *app) newInspectCmds() []*cobra.Command {
	return []*cobra.Command{a.newTasksCmd(), a.newWorkersCmd(), a.newQueuesCmd()}
}

func (a *app) newTasksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tasks list|run|retry|cancel|delete",
		Short: "list tasks by queue and state, and run, retry, cancel or delete them",
		Long: `Lists the tasks of a queue in a state, a page at a time, and acts on
tasks by id or on every task a filter names.

States: scheduled (due later, retries included), ready (in the order workers
take them), running, retrying, dead. Done and cancelled tasks are indexed
nowhere; look them up by id with "engine lookup ID".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want list, run, retry, cancel or delete")
		},
	}
	cmd.AddCommand(a.newTasksListCmd())
	for _, v := range []struct {
		act   engine.Action
		short string
	}{
		{engine.ActionRun, "make scheduled or retrying tasks ready now"},
		{engine.ActionRetry, "put dead tasks back in their queues, attempts reset (retrying ones: now)"},
		{engine.ActionCancel, "cancel tasks that have not started"},
		{engine.ActionDelete, "delete tasks in any state"},
	} {
		cmd.AddCommand(a.newTaskActionCmd(v.act, v.short))
	}
	return cmd
}

func (a *app) newTasksListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list --queue Q --state S [--search X] [--limit N] [--cursor C] [--json]",
		Short: "list one page of the tasks of a queue in a state",
		Args:  cobra.NoArgs,
	}
	c := addCommon(cmd)
	f := filterFlags(cmd)
	limit := cmd.Flags().Int("limit", 50, "at most this many tasks (1 to 1000)")
	cur := cmd.Flags().String("cursor", "", "resume where the previous page ended")
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *f.state == "" {
			return a.usageError(cmd, "want --state")
		}
		if err := f.check(a, cmd); err != nil {
			return err
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		page, err := s.in.ListTasks(cmd.Context(), engine.ListOptions{Filter: f.filter(), Limit: *limit, Cursor: *cur})
		if err != nil {
			return a.fail("tasks list", err)
		}
		if *asJSON {
			out := pageJSON{Tasks: []taskViewJSON{}, Total: page.Total, Next: page.Next}
			for _, t := range page.Tasks {
				tj := taskViewJSON{taskJSON: taskToJSON(t)}
				if !t.Lease.IsZero() {
					l := t.Lease.UTC()
					tj.Lease = &l
				}
				out.Tasks = append(out.Tasks, tj)
			}
			return a.printJSON(out)
		}
		printTaskPage(safetext.Writer(a.stdout), f.filter(), page, time.Now())
		return nil
	}
	return cmd
}

type filterFlagSet struct {
	queue, state, search *string
	priority             *int
	key                  *string
}

func filterFlags(cmd *cobra.Command) filterFlagSet {
	return filterFlagSet{
		queue:    cmd.Flags().String("queue", "default", "the queue (running and dead: \"\" for every queue)"),
		state:    cmd.Flags().String("state", "", "scheduled, ready, running, retrying or dead"),
		search:   cmd.Flags().String("search", "", "keep tasks whose id or type is this, or whose payload contains it"),
		priority: cmd.Flags().Int("priority", 0, "keep tasks of this `level`, 1 to 4 (0: every level)"),
		key:      cmd.Flags().String("key", "", "keep the tasks of this flow-control `key` (ready and scheduled ones of a key are listed only with it)"),
	}
}

func (f filterFlagSet) filter() engine.Filter {
	return engine.Filter{Queue: *f.queue, State: engine.State(*f.state), Search: *f.search, Priority: *f.priority, Key: *f.key}
}

// check refuses a bad --priority before anything is sent.
func (f filterFlagSet) check(a *app, cmd *cobra.Command) error {
	if err := checkPriority(*f.priority, true); err != nil {
		return a.usageError(cmd, "--priority %d: %v", *f.priority, err)
	}
	return nil
}

type pageJSON struct {
	Tasks []taskViewJSON `json:"tasks"`
	Total int64          `json:"total"`
	Next  string         `json:"next,omitempty"`
}

type taskViewJSON struct {
	taskJSON
	Lease *time.Time `json:"lease,omitempty"`
}

// pad pads s to n characters, without cutting it (an id), control
// characters shown as spaces.
func pad(s string, n int) string {
	return fit(s, max(n, utf8.RuneCountInString(s)))
}

// fit pads or cuts s to n characters, marking a cut with "…".
func fit(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if c := utf8.RuneCountInString(s); c <= n {
		return s + strings.Repeat(" ", n-c)
	}
	return string([]rune(s)[:n-1]) + "…"
}

// ago says briefly how far t is from now: "in 5m", "12s ago".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	a := d.Abs()
	var s string
	switch {
	case a >= 48*time.Hour:
		s = fmt.Sprintf("%dd", a/(24*time.Hour))
	case a >= time.Hour:
		s = fmt.Sprintf("%dh%02dm", a/time.Hour, a%time.Hour/time.Minute)
	case a >= time.Minute:
		s = fmt.Sprintf("%dm%02ds", a/time.Minute, a%time.Minute/time.Second)
	case a >= time.Second:
		s = fmt.Sprintf("%.1fs", a.Seconds())
	default:
		s = fmt.Sprintf("%dms", a.Milliseconds())
	}
	if d < 0 {
		return s + " ago"
	}
	return "in " + s
}

func printTaskPage(w io.Writer, f engine.Filter, page *engine.TaskPage, now time.Time) {
	when, info := "DUE", "PAYLOAD"
	switch f.State {
	case engine.StateRunning:
		when, info = "STARTED", "WORKER / LEASE"
	case engine.StateRetrying:
		when, info = "NEXT", "LAST ERROR"
	case engine.StateDead:
		when, info = "DIED", "REASON"
	}
	// 14 + 12 + 5 + 12 + 33 + 4 separators = 80. An id is never cut, so
	// that it can be pasted into another command: a longer one widens
	// its column (and the line), and a running task's worker id ends its
	// line whole.
	idW := 14
	for _, t := range page.Tasks {
		idW = max(idW, utf8.RuneCountInString(t.ID))
	}
	row := func(id, typ, att, at, rest string) {
		if !strings.HasPrefix(info, "WORKER") {
			rest = fit(rest, 33)
		}
		line := pad(id, idW) + " " + fit(typ, 12) + " " + fit(att, 5) + " " + fit(at, 12) + " " + rest
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	row("ID", "TYPE", "ATT", when, info)
	for _, t := range page.Tasks {
		at, rest := ago(t.Due, now), t.Preview
		switch t.State {
		case engine.StateRunning:
			at, rest = ago(t.Started, now), t.Worker+" "+ago(t.Lease, now)
		case engine.StateRetrying:
			rest = firstLine(t.LastError)
		case engine.StateDead:
			at, rest = ago(t.Finished, now), firstLine(t.LastError)
		}
		row(t.ID, t.Type, fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts), at, rest)
	}
	where := "queue " + f.Queue
	if f.Queue == "" {
		where = "every queue"
	}
	fmt.Fprintf(w, "%d shown of %d %s in %s\n", len(page.Tasks), page.Total, f.State, where)
	if page.Next != "" {
		fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
	}
}

func (a *app) newTaskActionCmd(act engine.Action, short string) *cobra.Command {
	verb := string(act)
	cmd := &cobra.Command{
		Use:   verb + " (ID... | --all --queue Q --state S [--search X]) [--yes]",
		Short: short,
		Long: strings.ToUpper(short[:1]) + short[1:] + `.

Each batch of tasks is one transaction that reads the tasks again and applies the action only where it still applies; tasks it does not
apply to are counted as skipped. With --all the action applies to every task
the filter names (asks first on a terminal, or takes --yes).`,
	}
	c := addCommon(cmd)
	f := filterFlags(cmd)
	all := cmd.Flags().Bool("all", false, "act on every task of --queue in --state (matching --search)")
	yes := cmd.Flags().Bool("yes", false, "do not ask before acting on --all")
	asJSON := cmd.Flags().Bool("json", false, "print the counts as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *all == (len(args) > 0) {
			return a.usageError(cmd, "want task ids or --all")
		}
		if *all && *f.state == "" {
			return a.usageError(cmd, "--all wants --state")
		}
		if err := f.check(a, cmd); err != nil {
			return err
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		ctx, in := cmd.Context(), s.in
		var res engine.ActionResult
		if *all {
			filter := f.filter()
			if !*yes {
				ok, err := a.confirm(cmd, in, act, filter)
				if err != nil || !ok {
					return err
				}
			}
			res, err = in.ActAll(ctx, act, filter)
		} else {
			res, err = in.Act(ctx, act, args...)
		}
		if *asJSON && err == nil {
			return a.printJSON(res)
		}
		fmt.Fprintf(a.stdout, "%s: %d done, %d skipped (state does not allow it), %d not found\n",
			verb, res.Done, res.Skipped, res.Missing)
		if err != nil {
			return a.fail("tasks "+verb, err)
		}
		switch {
		case res.Missing > 0 && res.Done+res.Skipped == 0:
			return exitCode(exitNotFound)
		case res.Skipped > 0 && res.Done == 0:
			return exitCode(exitRefused)
		}
		return nil
	}
	return cmd
}

// confirm asks on a terminal before a bulk action; elsewhere it wants
// --yes.
func (a *app) confirm(cmd *cobra.Command, in *engine.Inspector, act engine.Action, f engine.Filter) (bool, error) {
	if !isTerminal(a.stdin) {
		return false, a.usageError(cmd, "--all changes every matching task: add --yes")
	}
	page, err := in.ListTasks(cmd.Context(), engine.ListOptions{Filter: f, Limit: 1})
	if err != nil {
		return false, a.fail("tasks "+string(act), err)
	}
	what := fmt.Sprintf("%d %s tasks", page.Total, f.State)
	if f.Search != "" {
		what = fmt.Sprintf("the %s tasks matching %q (of %d)", f.State, f.Search, page.Total)
	}
	fmt.Fprintf(a.stdout, "%s %s in queue %q? [y/N] ", act, what, f.Queue)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
		fmt.Fprintln(a.stdout, "nothing done")
		return false, nil
	}
	return true, nil
}

func (a *app) newWorkersCmd() *cobra.Command {
	return newListCmd(a, "workers", "list the registered worker processes",
		func(ctx context.Context, in *engine.Inspector) ([]engine.WorkerInfo, error) { return in.Workers(ctx) }, printWorkers)
}

// newListCmd builds "<what> [--json]": it lists what fetch reads from the
// inspector, as a table (print) or as JSON. A partial answer (a shard
// that did not answer) is printed first, then its error is returned.
func newListCmd[T any](a *app, what, short string, fetch func(context.Context, *engine.Inspector) ([]T, error), print func(io.Writer, []T)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   what + " [--json]",
		Short: short,
		Args:  cobra.NoArgs,
	}
	c := addCommon(cmd)
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		xs, err := fetch(cmd.Context(), s.in)
		if xs == nil && err != nil {
			return a.fail(what, err)
		}
		if *asJSON {
			if xs == nil {
				xs = []T{}
			}
			if jerr := a.printJSON(xs); jerr != nil {
				return jerr
			}
		} else {
			print(safetext.Writer(a.stdout), xs)
		}
		if err != nil {
			return a.fail(what, err)
		}
		return nil
	}
	return cmd
}

func printWorkers(w io.Writer, ws []engine.WorkerInfo) {
	// 20 + 5 + 14 + 7 + 7 + 7 + 16 + 6 separators = 82 - 2: the last
	// column takes what is left. An id is never cut: a longer one widens
	// its column.
	idW := 20
	for _, x := range ws {
		idW = max(idW, utf8.RuneCountInString(x.ID))
	}
	row := func(id, alive, host, pid, beat, run, queues string) {
		line := pad(id, idW) + " " + fit(alive, 5) + " " + fit(host, 14) + " " + fit(pid, 7) + " " +
			fit(beat, 7) + " " + fit(run, 7) + " " + fit(queues, 13)
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	row("ID", "ALIVE", "HOST", "PID", "BEAT", "RUNNING", "QUEUES")
	for _, x := range ws {
		alive, beat := "yes", fmt.Sprintf("%.1fs", x.HeartbeatAge.Seconds())
		if !x.Alive {
			alive, beat = "no", "-"
		}
		run := fmt.Sprint(x.Running)
		if x.Concurrency > 0 {
			run = fmt.Sprintf("%d/%d", x.Running, x.Concurrency)
		}
		row(x.ID, alive, x.Host, fmt.Sprint(x.PID), beat, run, strings.Join(x.Queues, ","))
	}
	fmt.Fprintf(w, "%d workers\n", len(ws))
}

func (a *app) newQueuesCmd() *cobra.Command {
	return newListCmd(a, "queues", "list the queues with their sizes by state, latency and totals",
		func(ctx context.Context, in *engine.Inspector) ([]engine.QueueInfo, error) { return in.Queues(ctx) }, printQueues)
}

func printQueues(w io.Writer, qs []engine.QueueInfo) {
	// 14 + 7*6 + 8 + 6 + 8 separators = 78.
	row := func(cells ...string) {
		line := fit(cells[0], 14)
		for _, c := range cells[1:7] {
			line += " " + fmt.Sprintf("%7s", clipLeft(c, 7))
		}
		line += " " + fmt.Sprintf("%8s", clipLeft(cells[7], 8)) + " " + cells[8]
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	row("QUEUE", "READY", "SCHED", "RUN", "RETRY", "DEAD", "DONE", "LATENCY", "PAUSED")
	for _, q := range qs {
		lat := "-"
		if q.Latency > 0 {
			lat = q.Latency.Round(time.Millisecond).String()
		}
		paused := "no"
		if q.Paused {
			paused = "yes"
		}
		row(q.Queue, count(q.Ready), count(q.Scheduled), count(q.Running), count(q.Retrying), count(q.Dead),
			count(q.Processed), lat, paused)
	}
}

// count prints n in at most 7 characters: 12345678 is "12.3M".
func count(n int64) string {
	switch {
	case n >= 10_000_000_000:
		return fmt.Sprintf("%.1fG", float64(n)/1e9)
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

func clipLeft(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
