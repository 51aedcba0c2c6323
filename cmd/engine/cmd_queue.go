package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

func (a *app) newQueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue pause|resume|limit|keys NAME",
		Short: "pause or resume a queue, or set its flow control",
		Long: `Pauses or resumes a queue. While a queue is paused no worker starts a task
of it (none after pause returns), running tasks finish, due tasks are still
made ready, and enqueueing works; stats shows the queue as paused. The pause
is kept in Redis: it survives restarts of every process until resume, which
wakes idle workers at once.

limit NAME --max-running N sets the queue's concurrency limit: at no instant
do more than N of its tasks run, across every worker process; 0 removes the
limit. Workers apply a change within a second (docs/flow-control.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want pause, resume or limit")
		},
	}
	for _, verb := range []string{"pause", "resume"} {
		sub := &cobra.Command{Use: verb + " NAME", Short: verb + " queue NAME", Args: cobra.ArbitraryArgs}
		c := addCommon(sub)
		sub.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return a.usageError(cmd, "want one queue name")
			}
			s, err := a.connect(cmd, c)
			if err != nil {
				return err
			}
			defer s.close()
			op := s.in.PauseQueue // every lane with shards
			if verb == "resume" {
				op = s.in.ResumeQueue
			}
			if err := op(cmd.Context(), args[0]); err != nil {
				return a.fail(verb, err)
			}
			fmt.Fprintf(a.stdout, "queue %s %sd\n", args[0], verb)
			return nil
		}
		cmd.AddCommand(sub)
	}
	cmd.AddCommand(a.newQueueLimitCmd(), a.newQueueKeysCmd())
	return cmd
}

func (a *app) newQueueKeysCmd() *cobra.Command {
	sub := &cobra.Command{
		Use:   "keys NAME [--limit N] [--json]",
		Short: "list queue NAME's keys with tasks waiting, the next in turn first",
		Args:  cobra.ArbitraryArgs,
	}
	c := addCommon(sub)
	limit := sub.Flags().Int("limit", 50, "at most this many keys (1 to 1000)")
	asJSON := sub.Flags().Bool("json", false, "print JSON")
	sub.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return a.usageError(cmd, "want one queue name")
		}
		if *limit < 1 || *limit > 1000 {
			return a.usageError(cmd, "--limit %d: want 1 to 1000", *limit)
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		keys, err := s.in.Keys(cmd.Context(), args[0], *limit)
		if err != nil {
			return a.fail("queue keys", err)
		}
		if *asJSON {
			if keys == nil {
				keys = []engine.KeyInfo{}
			}
			return json.NewEncoder(a.stdout).Encode(keys)
		}
		if len(keys) == 0 {
			fmt.Fprintf(a.stdout, "queue %s: no key has tasks waiting\n", args[0])
			return nil
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tWAITING\tRUNNING\tNEXT TURN")
		now := time.Now()
		for _, k := range keys {
			next := "now"
			if k.Next.After(now) {
				next = relative(k.Next, now)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", safetext.Line(k.Key), k.Waiting, k.Running, next)
		}
		return tw.Flush()
	}
	return sub
}

func (a *app) newQueueLimitCmd() *cobra.Command {
	sub := &cobra.Command{
		Use:   "limit NAME [--max-running N] [--rate N/period] [--key-max-running N] [--key-rate N/period]",
		Short: "set queue NAME's flow control: the limits given, the others removed",
		Args:  cobra.ArbitraryArgs,
	}
	c := addCommon(sub)
	fl := sub.Flags()
	maxRunning := fl.Int("max-running", 0, "at most `N` tasks of the queue run at once, across every worker (0: no limit)")
	rate := fl.String("rate", "", "at most N of the queue's tasks start in any window of the period, such as `10/1s`")
	keyMaxRunning := fl.Int("key-max-running", 0, "at most `N` tasks of one key run at once (0: no limit)")
	keyRate := fl.String("key-rate", "", "at most N tasks of one key start in any window of the period, such as `2/1s`")
	sub.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return a.usageError(cmd, "want one queue name")
		}
		if !(fl.Changed("max-running") || fl.Changed("rate") || fl.Changed("key-max-running") || fl.Changed("key-rate")) {
			return a.usageError(cmd, "want at least one of --max-running, --rate, --key-max-running, --key-rate")
		}
		if *maxRunning < 0 || *keyMaxRunning < 0 {
			return a.usageError(cmd, "--max-running and --key-max-running: want 0 (no limit) or more")
		}
		for _, r := range []struct{ flag, v string }{{"--rate", *rate}, {"--key-rate", *keyRate}} {
			if _, err := buckets.ParseRate(r.v); err != nil {
				return a.usageError(cmd, "%s %s: want N/period, such as 10/1s", r.flag, safetext.Quote(r.v))
			}
		}
		qc := engine.QueueConfig{Name: args[0], MaxRunning: *maxRunning, Rate: *rate, KeyMaxRunning: *keyMaxRunning, KeyRate: *keyRate}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		if err := s.in.SetQueueLimits(cmd.Context(), qc); err != nil {
			return a.fail("queue limit", err)
		}
		fmt.Fprintf(a.stdout, "queue %s: %s\n", args[0], limitsText(qc))
		return nil
	}
	return sub
}

// limitsText says a queue's flow control in words.
func limitsText(qc engine.QueueConfig) string {
	var parts []string
	if qc.MaxRunning > 0 {
		parts = append(parts, fmt.Sprintf("at most %d running", qc.MaxRunning))
	}
	if qc.Rate != "" {
		parts = append(parts, "at most "+qc.Rate+" started")
	}
	if qc.KeyMaxRunning > 0 {
		parts = append(parts, fmt.Sprintf("at most %d running per key", qc.KeyMaxRunning))
	}
	if qc.KeyRate != "" {
		parts = append(parts, "at most "+qc.KeyRate+" started per key")
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}
