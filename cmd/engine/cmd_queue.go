package main

import (
	"fmt"
	"strings"

	"github.com/bucketq/bucketq/engine"
	"github.com/spf13/cobra"
)

func (a *app) newQueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue pause|resume|limit NAME",
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
	cmd.AddCommand(a.newQueueLimitCmd())
	return cmd
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
