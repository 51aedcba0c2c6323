package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

func (a *app) newWorkflowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workflow enqueue|show|cancel",
		Short: "enqueue, show or cancel a chain or group",
		Long: `Enqueues a workflow (a chain of steps or a group of members with a
callback) from a JSON spec; shows one: its state, each step's or member's
task id, type and state, and where a chain stopped; or cancels it. A
workflow is kept for done_retention after it ended. Exits 3 if not found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.usageError(cmd, "want enqueue, show or cancel")
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
		wf, err := s.in.Workflow(cmd.Context(), args[0])
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
		n, err := s.client.CancelWorkflow(cmd.Context(), args[0])
		if err != nil {
			return a.fail("workflow cancel", err)
		}
		fmt.Fprintf(a.stdout, "workflow %s cancelled (%d tasks cancelled)\n", args[0], n)
		return nil
	}
	cmd.AddCommand(a.newWorkflowEnqueueCmd(), show, cancel)
	return cmd
}

func (a *app) newWorkflowEnqueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "enqueue --file SPEC.json|-",
		Short: "enqueue a chain or a group from a JSON spec; prints its id",
		Long: `Enqueues a chain or a group described in JSON (--file PATH, or - for
stdin) and prints the workflow's id. A chain:

  {"id": "order-42", "chain": [
    {"type": "charge", "payload": {"order": 42}},
    {"type": "ship", "pass_result": true, "delay": "1m"}]}

A group, whose callback runs once every member is final:

  {"id": "report-7", "group": [{"type": "part", "payload": "a"}, {"type": "part", "payload": "b"}],
   "callback": {"type": "merge"}, "policy": "fail"}

A step has "type" (required), "payload" (a JSON string is the payload's
text; any other JSON value is the payload as JSON), "queue",
"max_attempts", "timeout" and "delay" (durations such as "30s"),
"metadata" (an object of strings) and, in a chain, "pass_result" (the
step gets its predecessor's result). "policy" is "fail" (the default: a
dead member fails the group and its callback does not run) or
"continue". An id in use exits 5 and writes nothing.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd)
	file := cmd.Flags().String("file", "", "the workflow spec: a JSON `file`, or - for stdin (required)")
	asJSON := cmd.Flags().Bool("json", false, "print the workflow as enqueued, in JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *file == "" {
			return a.usageError(cmd, "--file is required (a JSON spec; - reads stdin)")
		}
		raw, err := a.readSpec(*file)
		if err != nil {
			return a.fail("workflow enqueue", err)
		}
		spec, err := parseWorkflowSpec(raw)
		if err != nil {
			return a.usageError(cmd, "%v", err)
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		var wf *engine.WorkflowInfo
		if spec.Chain != nil {
			wf, err = s.client.EnqueueChain(cmd.Context(), spec.ID, spec.Chain...)
		} else {
			wf, err = s.client.EnqueueGroup(cmd.Context(), *spec.Group)
		}
		if err != nil {
			return a.fail("workflow enqueue", err)
		}
		if *asJSON {
			return a.printJSON(wf)
		}
		fmt.Fprintln(a.stdout, wf.ID)
		return nil
	}
	return cmd
}

// maxSpecBytes bounds a workflow spec read from a file or stdin: the
// engine refuses a workflow of more than 4 MiB of tasks anyway.
const maxSpecBytes = 4 << 20

// readSpec reads a workflow spec from path ("-": stdin), at most
// maxSpecBytes.
func (a *app) readSpec(path string) ([]byte, error) {
	b, name, _, err := a.readInput(path, maxSpecBytes)
	if err != nil {
		return nil, fmt.Errorf("read the workflow spec: %w", err)
	}
	if len(b) > maxSpecBytes {
		return nil, fmt.Errorf("the workflow spec from %s is more than %d bytes", name, maxSpecBytes)
	}
	return b, nil
}

// workflowSpec is what engine workflow enqueue reads.
type workflowSpec struct {
	ID       string     `json:"id"`
	Chain    []stepSpec `json:"chain"`
	Group    []stepSpec `json:"group"`
	Callback *stepSpec  `json:"callback"`
	Policy   string     `json:"policy"`
}

type stepSpec struct {
	Type        string            `json:"type"`
	Payload     json.RawMessage   `json:"payload"`
	Queue       string            `json:"queue"`
	MaxAttempts int               `json:"max_attempts"`
	Timeout     string            `json:"timeout"`
	Delay       string            `json:"delay"`
	PassResult  bool              `json:"pass_result"`
	Metadata    map[string]string `json:"metadata"`
}

// parsedSpec is a checked spec: a chain's steps, or a group.
type parsedSpec struct {
	ID    string
	Chain []engine.Step
	Group *engine.Group
}

// parseWorkflowSpec decodes and checks a spec. Its errors say where (the
// step's place) and what; the engine checks types, queues, ids and sizes
// again when it enqueues.
func parseWorkflowSpec(raw []byte) (*parsedSpec, error) {
	var spec workflowSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("workflow spec: %w", err)
	}
	if dec.More() {
		return nil, errors.New("workflow spec: more than one JSON value")
	}
	if spec.ID == "" {
		return nil, errors.New(`workflow spec: "id" is required`)
	}
	switch {
	case spec.Chain != nil && spec.Group != nil:
		return nil, errors.New(`workflow spec: want "chain" or "group", not both`)
	case spec.Chain != nil:
		if spec.Callback != nil || spec.Policy != "" {
			return nil, errors.New(`workflow spec: "callback" and "policy" belong to a group`)
		}
		if len(spec.Chain) == 0 {
			return nil, errors.New(`workflow spec: "chain" has no steps`)
		}
		steps, err := specSteps("chain", spec.Chain, true)
		if err != nil {
			return nil, err
		}
		return &parsedSpec{ID: spec.ID, Chain: steps}, nil
	case spec.Group != nil:
		if len(spec.Group) == 0 {
			return nil, errors.New(`workflow spec: "group" has no members`)
		}
		members, err := specSteps("group", spec.Group, false)
		if err != nil {
			return nil, err
		}
		g := &engine.Group{ID: spec.ID, Members: members}
		switch spec.Policy {
		case "", "fail":
			g.ContinueOnFailure = false
		case "continue":
			g.ContinueOnFailure = true
		default:
			return nil, fmt.Errorf(`workflow spec: "policy" %q: want "fail" or "continue"`, spec.Policy)
		}
		if spec.Callback != nil {
			cb, err := specStep("callback", *spec.Callback, false)
			if err != nil {
				return nil, err
			}
			g.Callback = &cb
		}
		return &parsedSpec{ID: spec.ID, Group: g}, nil
	}
	return nil, errors.New(`workflow spec: want "chain" (a list of steps) or "group" (a list of members)`)
}

func specSteps(what string, in []stepSpec, chain bool) ([]engine.Step, error) {
	out := make([]engine.Step, len(in))
	for i, st := range in {
		var err error
		if out[i], err = specStep(fmt.Sprintf("%s[%d]", what, i), st, chain); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// specStep makes one step; where names it in errors.
func specStep(where string, in stepSpec, chain bool) (engine.Step, error) {
	bad := func(format string, args ...any) (engine.Step, error) {
		return engine.Step{}, fmt.Errorf("workflow spec: %s: %s", where, fmt.Sprintf(format, args...))
	}
	if in.Type == "" {
		return bad(`"type" is required`)
	}
	if err := checkTaskType(in.Type); err != nil {
		return bad(`"type": %v`, err)
	}
	if in.PassResult && !chain {
		return bad(`"pass_result" belongs to a chain's step`)
	}
	st := engine.Step{Type: in.Type, PassResult: in.PassResult}
	if len(in.Payload) > 0 && string(in.Payload) != "null" {
		var text string
		if err := json.Unmarshal(in.Payload, &text); err == nil {
			st.Payload = []byte(text)
		} else {
			var compact bytes.Buffer
			if err := json.Compact(&compact, in.Payload); err != nil {
				return bad(`"payload": %v`, err)
			}
			st.Payload = compact.Bytes()
		}
	}
	duration := func(name, v string) (time.Duration, error) {
		if v == "" {
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("workflow spec: %s: %q %q: want a duration such as 30s", where, name, v)
		}
		return d, nil
	}
	var err error
	if st.Delay, err = duration("delay", in.Delay); err != nil {
		return engine.Step{}, err
	}
	timeout, err := duration("timeout", in.Timeout)
	if err != nil {
		return engine.Step{}, err
	}
	if in.Queue != "" {
		st.Options = append(st.Options, engine.Queue(in.Queue))
	}
	if in.MaxAttempts != 0 {
		st.Options = append(st.Options, engine.MaxAttempts(in.MaxAttempts))
	}
	if timeout > 0 {
		st.Options = append(st.Options, engine.Timeout(timeout))
	}
	if len(in.Metadata) > 0 {
		st.Options = append(st.Options, engine.Metadata(in.Metadata))
	}
	return st, nil
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
