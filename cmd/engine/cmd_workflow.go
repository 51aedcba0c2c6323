package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

func (a *app) newWorkflowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workflow show|cancel ID",
		Short: "show or cancel a chain or group",
		Long: `Shows a workflow (a chain of steps or a group of members with a callback):
its state, each step's or member's task id, type and state, and where a
chain stopped; or cancels it. A workflow is kept for done_retention after
it ended. Exits 3 if not found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want show or cancel")
		},
	}
	show := &cobra.Command{Use: "show ID [--json]", Short: "show workflow ID: its steps or members and their states", Args: oneWorkflowID}
	c := addCommon(show)
	asJSON := show.Flags().Bool("json", false, "print JSON")
	show.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		wf, err := s.inspector().Workflow(cmd.Context(), args[0])
		if err != nil {
			return a.fail("workflow show", err)
		}
		if *asJSON {
			return a.printJSON(wf)
		}
		printWorkflow(safetext.Writer(a.stdout), wf)
		return nil
	}
	cancel := &cobra.Command{Use: "cancel ID", Short: "cancel workflow ID: its waiting tasks, and what follows its running ones", Args: oneWorkflowID}
	cc := addCommon(cancel)
	cancel.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := a.connect(cmd, cc)
		if err != nil {
			return err
		}
		defer s.close()
		n, err := s.tasks().CancelWorkflow(cmd.Context(), args[0])
		if err != nil {
			return a.fail("workflow cancel", err)
		}
		fmt.Fprintf(a.stdout, "workflow %s cancelled (%d tasks cancelled)\n", args[0], n)
		return nil
	}
	cmd.AddCommand(show, cancel)
	return cmd
}

// oneWorkflowID accepts exactly one argument, a workflow id.
func oneWorkflowID(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one workflow id, got %d arguments", len(args))
	}
	return nil
}

func printWorkflow(w io.Writer, wf *engine.WorkflowInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "workflow\t%s (%s)\n", wf.ID, wf.Kind)
	fmt.Fprintf(tw, "state\t%s\n", wf.State)
	fmt.Fprintf(tw, "created\t%s\n", stamp(wf.Created))
	if wf.Kind == "group" {
		fmt.Fprintf(tw, "policy\t%s\n", wf.Policy)
		fmt.Fprintf(tw, "final\t%d of %d members\n", wf.Final, len(wf.Steps))
	}
	if wf.StoppedAt >= 0 {
		fmt.Fprintf(tw, "stopped at\tstep %d (%s): retry it from the dead letters to resume\n", wf.StoppedAt, wf.Steps[wf.StoppedAt].ID)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tID\tTYPE\tSTATE\tERROR")
	for _, s := range wf.Steps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.Index, s.ID, s.Type, s.State, firstLine(s.Error))
	}
	if cb := wf.Callback; cb != nil {
		fmt.Fprintf(tw, "cb\t%s\t%s\t%s\t%s\n", cb.ID, cb.Type, cb.State, firstLine(cb.Error))
	}
	tw.Flush()
}
