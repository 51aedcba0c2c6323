package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) newQueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue pause|resume NAME",
		Short: "pause or resume a queue",
		Long: `Pauses or resumes a queue. While a queue is paused no worker starts a task
of it (none after pause returns), running tasks finish, due tasks are still
made ready, and enqueueing works; stats shows the queue as paused. The pause
is kept in Redis: it survives restarts of every process until resume, which
wakes idle workers at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want pause or resume")
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
	return cmd
}
