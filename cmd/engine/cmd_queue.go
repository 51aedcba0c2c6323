package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) newQueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue pause|resume|limit NAME",
		Short: "pause or resume a queue, or set its concurrency limit",
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
	sub := &cobra.Command{Use: "limit NAME --max-running N", Short: "set queue NAME's concurrency limit (0: none)", Args: cobra.ArbitraryArgs}
	c := addCommon(sub)
	maxRunning := sub.Flags().Int("max-running", -1, "at most `N` tasks of the queue run at once, across every worker; 0 removes the limit")
	sub.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return a.usageError(cmd, "want one queue name")
		}
		if !cmd.Flags().Changed("max-running") {
			return a.usageError(cmd, "want --max-running N")
		}
		if *maxRunning < 0 {
			return a.usageError(cmd, "--max-running %d: want 0 (no limit) or more", *maxRunning)
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		if err := s.in.SetQueueLimit(cmd.Context(), args[0], *maxRunning); err != nil {
			return a.fail("queue limit", err)
		}
		if *maxRunning == 0 {
			fmt.Fprintf(a.stdout, "queue %s: no concurrency limit\n", args[0])
		} else {
			fmt.Fprintf(a.stdout, "queue %s: at most %d running\n", args[0], *maxRunning)
		}
		return nil
	}
	return sub
}
