package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// watchFlag is --watch (2 s) or --watch=INTERVAL; "--watch 5s" is read
// by stats from its argument.
type watchFlag struct{ every time.Duration }

const defaultWatch = 2 * time.Second

func (w *watchFlag) IsBoolFlag() bool { return true }

func (w *watchFlag) String() string {
	if w == nil || w.every == 0 {
		return ""
	}
	return w.every.String()
}

func (w *watchFlag) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		w.every = 0
		if b {
			w.every = defaultWatch
		}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 100*time.Millisecond {
		return fmt.Errorf("want an interval of at least 100ms, e.g. 5s")
	}
	w.every = d
	return nil
}

func (a *app) cmdStats(ctx context.Context, args []string) int {
	fs := a.newFlags("stats", "[--json] [--watch [INTERVAL]]", `
Shows, per queue: tasks ready, scheduled, running, retrying (waiting for
their next attempt) and dead; processed, failed, recovered and cancelled
counts since the queue was first used; how long the oldest ready task has
waited; when the next scheduled task is due. --watch refreshes in place
every INTERVAL (default 2s) until interrupted; with --json it prints one
JSON document per refresh.`)
	c := addCommon(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	var watch watchFlag
	fs.Var(&watch, "watch", "refresh every `interval` (--watch alone: 2s) until interrupted")
	pos, code, ok := a.parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) == 1 && watch.every > 0 {
		if err := watch.Set(pos[0]); err != nil {
			fmt.Fprintf(a.stderr, "engine stats: --watch %s: %v\n", pos[0], err)
			return exitUsage
		}
	} else if len(pos) > 0 {
		fmt.Fprintf(a.stderr, "engine stats: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	s, code := a.connect("stats", c)
	if s == nil {
		return code
	}
	defer s.close()
	for {
		st, err := s.client.Stats(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return exitOK
		case err != nil && watch.every == 0:
			return a.fail("stats", err)
		case err != nil: // keep watching through an outage
			fmt.Fprintf(a.stderr, "%s engine stats: %v\n", time.Now().Format("15:04:05"), err)
		case *asJSON && watch.every > 0:
			b, _ := json.Marshal(statsToJSON(st))
			fmt.Fprintf(a.stdout, "%s\n", b)
		case *asJSON:
			return a.printJSON(statsToJSON(st))
		case watch.every > 0:
			fmt.Fprint(a.stdout, "\x1b[H\x1b[2J") // home, clear screen
			fmt.Fprintf(a.stdout, "%s  every %v, namespace %s  (Ctrl-C to stop)\n\n",
				time.Now().Format("15:04:05"), watch.every, s.set.Namespace)
			printStats(a.stdout, st)
		default:
			printStats(a.stdout, st)
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(watch.every):
		}
	}
}

// statsJSON is what stats --json prints.
type statsJSON struct {
	Time   time.Time        `json:"time"`
	Queues []queueStatsJSON `json:"queues"`
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
	OldestReadyAgeMS int64      `json:"oldest_ready_age_ms"`
	NextDue          *time.Time `json:"next_due"`
}

func statsToJSON(st []engine.QueueStats) statsJSON {
	out := statsJSON{Time: time.Now().UTC(), Queues: []queueStatsJSON{}}
	for _, q := range st {
		j := queueStatsJSON{Queue: q.Queue, Ready: q.Ready, Scheduled: q.Scheduled, Running: q.Running,
			Retrying: q.Retrying, Dead: q.Dead, Processed: q.Processed, Failed: q.Failed,
			Recovered: q.Recovered, Cancelled: q.Cancelled, OldestReadyAgeMS: q.OldestReadyAge.Milliseconds()}
		if !q.NextDue.IsZero() {
			t := q.NextDue.UTC()
			j.NextDue = &t
		}
		out.Queues = append(out.Queues, j)
	}
	return out
}

func printStats(w io.Writer, st []engine.QueueStats) {
	if len(st) == 0 {
		fmt.Fprintln(w, "no queues yet: nothing was ever enqueued in this namespace")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tREADY\tSCHEDULED\tRUNNING\tRETRYING\tDEAD\tPROCESSED\tFAILED\tRECOVERED\tCANCELLED\tOLDEST READY\tNEXT DUE")
	for _, q := range st {
		oldest, next := "-", "-"
		if q.Ready > 0 {
			oldest = q.OldestReadyAge.Round(time.Millisecond).String()
		}
		if !q.NextDue.IsZero() {
			next = fmt.Sprintf("%s (in %v)", q.NextDue.Local().Format("15:04:05"), max(0, time.Until(q.NextDue)).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", q.Queue, q.Ready, q.Scheduled, q.Running,
			q.Retrying, q.Dead, q.Processed, q.Failed, q.Recovered, q.Cancelled, oldest, next)
	}
	tw.Flush()
}

func (a *app) cmdDead(ctx context.Context, args []string) int {
	fs := a.newFlags("dead", "list [--json] [--offset N] [--limit N] | retry ID|--all | purge ID|--all", `
Manages dead letters: tasks that failed max_attempts times, failed
permanently, or had no handler (unknown_type: dead).
  list          newest first, with the last error
  retry ID      put one back at the front of its queue, attempts reset
  retry --all   put every one back
  purge ID      delete one
  purge --all   delete every one`)
	c := addCommon(fs)
	asJSON := fs.Bool("json", false, "list: print JSON")
	offset := fs.Int("offset", 0, "list: skip this many")
	limit := fs.Int("limit", 50, "list: show at most this many")
	all := fs.Bool("all", false, "retry or purge every dead letter")
	pos, code, ok := a.parse(fs, args)
	if !ok {
		return code
	}
	usage := func(format string, args ...any) int {
		fmt.Fprintf(a.stderr, "engine dead: "+format+"\n", args...)
		return exitUsage
	}
	if len(pos) == 0 {
		return usage("want list, retry or purge")
	}
	sub, rest := pos[0], pos[1:]
	switch {
	case sub != "list" && sub != "retry" && sub != "purge":
		return usage("unknown subcommand %q: want list, retry or purge", sub)
	case sub == "list" && (len(rest) > 0 || *all):
		return usage("list takes no arguments")
	case sub == "list" && (*offset < 0 || *limit < 1):
		return usage("want --offset 0 or more and --limit 1 or more")
	case sub != "list" && *all == (len(rest) == 1):
		return usage("%s wants one task id or --all", sub)
	case len(rest) > 1:
		return usage("%s wants one task id", sub)
	}
	s, code := a.connect("dead", c)
	if s == nil {
		return code
	}
	defer s.close()
	switch {
	case sub == "list":
		return a.deadList(ctx, s, *offset, *limit, *asJSON)
	case *all:
		op, verb := s.client.RetryAllDead, "retried"
		if sub == "purge" {
			op, verb = s.client.PurgeAllDead, "purged"
		}
		n, err := op(ctx)
		if err != nil {
			return a.fail("dead "+sub, err)
		}
		fmt.Fprintf(a.stdout, "%s %d dead letters\n", verb, n)
	default:
		op, verb := s.client.RetryDead, "retried"
		if sub == "purge" {
			op, verb = s.client.PurgeDead, "purged"
		}
		if err := op(ctx, rest[0]); err != nil {
			return a.fail("dead "+sub, err)
		}
		fmt.Fprintf(a.stdout, "%s %s\n", verb, rest[0])
	}
	return exitOK
}

func (a *app) deadList(ctx context.Context, s *session, offset, limit int, asJSON bool) int {
	tasks, err := s.client.DeadLetters(ctx, offset, limit)
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
	total, err := s.client.DeadCount(ctx)
	if err != nil {
		return a.fail("dead list", err)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
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
	return exitOK
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
