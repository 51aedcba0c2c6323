package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// Workflows: chains (steps one after another) and groups (members in
// parallel, then a callback). See docs/workflows.md.
//
// A chain's next step is written by the same MULTI/EXEC that records its
// predecessor's success, with an id derived from the chain's
// ("<chain>~<i>"), so a chain never stalls between two steps and never
// forks: a step that runs twice (a lost lease) still has one successor.
// A group's members update the group's hash under WATCH in their final
// transitions, and the one that completes the group enqueues its callback
// ("<group>~cb"), once.

// Step is one task of a workflow: a chain's step, a group's member or a
// group's callback.
type Step struct {
	Type    string
	Payload []byte
	// Options may set Queue, MaxAttempts, Timeout and Metadata. TaskID
	// (the ids are the workflow's), At and In (use Delay), Unique,
	// ReplyTo, ExpireIn and Key are refused with ErrInvalid.
	Options []Option
	// Delay: a chain step is due this long after its predecessor
	// succeeded (the first step: after the chain is enqueued); a group's
	// callback this long after the group completed; a member this long
	// after the group is enqueued.
	Delay time.Duration
	// PassResult: a chain step (after the first) is given its
	// predecessor's result (SetResult) as Task.Workflow.Input, when it is
	// at most 64 KiB; a larger one is read with
	// Client.Result(ctx, Task.Workflow.Previous).
	PassResult bool
}

// groupPolicy is the stored policy of a group.
func groupPolicy(continueOnFailure bool) string {
	if continueOnFailure {
		return buckets.PolicyContinue
	}
	return buckets.PolicyFail
}

// Group is a fan-out and fan-in: Members run in parallel; when the last
// reaches a final state the Callback (if any) is enqueued once, its
// Task.Workflow.Outcomes listing every member's outcome and result.
type Group struct {
	ID       string // 1 to 100 printable ASCII bytes, no spaces
	Members  []Step
	Callback *Step
	// ContinueOnFailure: the callback runs once every member is done,
	// dead or cancelled, and lists each one's outcome. Without it (the
	// default), while a member is dead the group is failed and its
	// callback does not run; retrying the member from the dead letters
	// (when it then succeeds) completes the group and runs the callback.
	ContinueOnFailure bool
}

// maxWriteBytes bounds the tasks one call writes in one transaction,
// counted as their payloads, types, queues and metadata: a chain's steps, a
// group's members and callback (beyond it: ErrTooLarge), the tasks of
// an EnqueueBatch of more than one task (ErrTooLarge; a single
// task is bounded by Config.MaxPayload alone).
const maxWriteBytes = buckets.MaxWriteBytes

// checkWriteBytes refuses recs, matching kind, when together they pass
// maxWriteBytes: what names them in the error.
func checkWriteBytes(kind error, what string, recs []*buckets.Record) error {
	size := 0
	for _, r := range recs {
		size += len(r.Payload) + len(r.Type) + len(r.Queue)
		for k, v := range r.Metadata {
			size += len(k) + len(v)
		}
	}
	if size > maxWriteBytes {
		return refused(kind, nil, "%s: %d bytes of tasks (payloads, types, queues, metadata), limit %d", what, size, maxWriteBytes)
	}
	return nil
}

// Limits of workflows. Beyond them Enqueue{Chain,Group} refuse with an
// error matching ErrTooLarge.
const (
	maxChainSteps    = buckets.MaxChainSteps
	maxGroupMembers  = buckets.MaxGroupMembers
	maxWorkflowIDLen = buckets.MaxFlowIDLen
)

// TaskWorkflow is a task's part in a workflow (Task.Workflow).
type TaskWorkflow struct {
	ID    string // the workflow's id
	Kind  string // "chain" or "group"
	Index int    // the step's index in its chain, the member's in its group
	Total int    // steps of the chain, members of the group
	// Callback: this task is its group's callback.
	Callback bool
	// Input is the predecessor's result (a chain step with PassResult,
	// when it was carried).
	Input []byte
	// Previous is the id of the predecessor (chain steps after the
	// first).
	Previous string
	// Outcomes are the members' outcomes (a group's callback).
	Outcomes []Outcome
	// Cancelled: the chain was cancelled while this step ran or was
	// dead; no step follows it.
	Cancelled bool
}

func workflowOf(r *buckets.Record) *TaskWorkflow {
	f := r.Flow
	if f == nil {
		return nil
	}
	tw := &TaskWorkflow{ID: f.ID, Kind: f.Kind.String(), Index: f.Step, Total: f.Total,
		Callback: f.Kind == buckets.FlowCallback, Cancelled: f.Cancelled}
	switch f.Kind {
	case buckets.FlowChain:
		tw.Input = f.Input
		if f.Step > 0 {
			tw.Previous = buckets.FlowStepID(f.ID, f.Step-1)
		}
	case buckets.FlowCallback:
		tw.Index = 0
		_ = json.Unmarshal(f.Input, &tw.Outcomes) // written by the store: valid
	}
	return tw
}

// stepRecord checks step s and returns its record (ID and Flow unset).
func (c *laneClient) stepRecord(now time.Time, what string, s Step) (*buckets.Record, error) {
	if s.Delay < 0 {
		return nil, refused(ErrInvalid, nil, "%s: delay %v: want 0 or more", what, s.Delay)
	}
	r, chosen, err := c.cfg.record(now, s.Type, s.Payload, s.Options)
	if err != nil {
		return nil, &engineError{msg: fmt.Sprintf("engine: %s: %s", what, stripLayers(err.Error())), kind: kindOf(err), cause: err}
	}
	if chosen || r.Unique != "" || r.ReplyTo != "" || r.ExpireAt != 0 || r.Key != "" || r.Due != max(ms(now), 1) {
		return nil, refused(ErrInvalid, nil, "%s: TaskID, At, In, Unique, ReplyTo, ExpireIn and Key do not apply to a workflow's tasks (use Step.Delay)", what)
	}
	return r, nil
}

func checkWorkflowID(id string) error {
	if err := buckets.ValidateFlowID(id); err != nil {
		return refused(ErrInvalid, err, "%s", stripLayers(err.Error()))
	}
	return nil
}

// EnqueueChain is Client.EnqueueChain for one lane.
func (c *laneClient) EnqueueChain(ctx context.Context, id string, steps ...Step) (*WorkflowInfo, error) {
	if err := checkWorkflowID(id); err != nil {
		return nil, err
	}
	if len(steps) == 0 || len(steps) > maxChainSteps {
		return nil, refused(ErrTooLarge, nil, "chain %s: %d steps, want 1 to %d", id, len(steps), maxChainSteps)
	}
	now := c.cfg.Advanced.Clock.Now()
	recs := make([]*buckets.Record, len(steps))
	for i, s := range steps {
		r, err := c.stepRecord(now, fmt.Sprintf("chain %s: step %d", id, i), s)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	if err := checkWriteBytes(ErrTooLarge, "chain "+id+": its steps", recs); err != nil {
		return nil, err
	}
	head := recs[0]
	head.ID = buckets.FlowStepID(id, 0)
	head.Due = max(ms(now)+steps[0].Delay.Milliseconds(), 1)
	f := &buckets.Flow{ID: id, Kind: buckets.FlowChain, Step: 0, Total: len(steps)}
	for i, r := range recs[1:] {
		s := steps[i+1]
		f.Next = append(f.Next, buckets.StepOf(r, s.Delay.Milliseconds(), s.PassResult))
	}
	head.Flow = f
	if err := c.enqueueFlow(ctx, id, ms(now), buckets.ChainFields(len(steps), ms(now)), []*buckets.Record{head}); err != nil {
		return nil, err
	}
	return c.written(ctx, id, "chain", now), nil
}

// written reports a workflow just written: as Workflow reads it, or, when
// that read fails (the workflow is written all the same), its id, kind
// and creation time only.
func (c *laneClient) written(ctx context.Context, id, kind string, now time.Time) *WorkflowInfo {
	if wi, err := c.Workflow(ctx, id); err == nil {
		return wi
	}
	return &WorkflowInfo{ID: id, Kind: kind, Created: fromMs(ms(now)), State: "running", StoppedAt: -1}
}

// EnqueueGroup is Client.EnqueueGroup for one lane.
func (c *laneClient) EnqueueGroup(ctx context.Context, g Group) (*WorkflowInfo, error) {
	if err := checkWorkflowID(g.ID); err != nil {
		return nil, err
	}
	if len(g.Members) == 0 || len(g.Members) > maxGroupMembers {
		return nil, refused(ErrTooLarge, nil, "group %s: %d members, want 1 to %d", g.ID, len(g.Members), maxGroupMembers)
	}
	now := c.cfg.Advanced.Clock.Now()
	recs := make([]*buckets.Record, len(g.Members))
	for i, s := range g.Members {
		r, err := c.stepRecord(now, fmt.Sprintf("group %s: member %d", g.ID, i), s)
		if err != nil {
			return nil, err
		}
		r.ID = buckets.FlowStepID(g.ID, i)
		r.Due = max(ms(now)+s.Delay.Milliseconds(), 1)
		r.Flow = &buckets.Flow{ID: g.ID, Kind: buckets.FlowMember, Step: i, Total: len(g.Members)}
		recs[i] = r
	}
	var cb []byte
	if g.Callback != nil {
		r, err := c.stepRecord(now, fmt.Sprintf("group %s: callback", g.ID), *g.Callback)
		if err != nil {
			return nil, err
		}
		r.ID = buckets.FlowCallbackID(g.ID)
		r.Created, r.Due = 0, g.Callback.Delay.Milliseconds() // the template's Due is its delay
		cb = r.Encode()
		if err := checkWriteBytes(ErrTooLarge, "group "+g.ID+": its members and callback", append(recs[:len(recs):len(recs)], r)); err != nil {
			return nil, err
		}
	} else if err := checkWriteBytes(ErrTooLarge, "group "+g.ID+": its members", recs); err != nil {
		return nil, err
	}
	fields := buckets.GroupFields(len(g.Members), ms(now), groupPolicy(g.ContinueOnFailure), cb)
	if err := c.enqueueFlow(ctx, g.ID, ms(now), fields, recs); err != nil {
		return nil, err
	}
	return c.written(ctx, g.ID, "group", now), nil
}

func (c *laneClient) enqueueFlow(ctx context.Context, id string, now int64, fields []interface{}, recs []*buckets.Record) error {
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = c.store.EnqueueFlow(ctx, conn, now, id, fields, recs)
	var ex *buckets.ExistsError
	if errors.As(err, &ex) {
		return &ExistsError{IDs: ex.IDs}
	}
	if err != nil {
		return failed("enqueue workflow "+id, err)
	}
	c.cfg.observeEnqueued(recs, fromMs(now))
	return nil
}

// WorkflowInfo is a workflow as Client.Workflow reports it.
type WorkflowInfo struct {
	ID      string    `json:"id"`
	Kind    string    `json:"kind"` // "chain" or "group"
	Created time.Time `json:"created"`
	// State: "running"; "done" (a chain whose last step succeeded, a
	// group whose callback succeeded, or that completed without one);
	// "stopped" (a chain whose current step is dead); "failed" (a group
	// without ContinueOnFailure whose members are all final, one dead or
	// cancelled, or whose callback is dead); "cancelled" (the workflow,
	// or a group's callback, was cancelled).
	State string `json:"state"`
	// StoppedAt is the index of the dead step of a stopped chain, -1
	// otherwise.
	StoppedAt int            `json:"stopped_at"`
	Steps     []WorkflowStep `json:"steps"` // by index
	// Group only:
	Policy   string        `json:"policy,omitempty"`
	Final    int           `json:"final,omitempty"` // members in a final state
	Callback *WorkflowStep `json:"callback,omitempty"`
}

// WorkflowStep is a step or member as WorkflowInfo shows it.
type WorkflowStep struct {
	Index int    `json:"index"`
	ID    string `json:"id"`
	Type  string `json:"type,omitempty"`
	// State is the task's state; "pending" for a chain step not reached
	// yet (or a callback not enqueued), "expired" for one whose record's
	// retention passed.
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
}

// Workflow is Client.Workflow for one lane.
func (c *laneClient) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	if err := checkWorkflowID(id); err != nil {
		return nil, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	fi, err := c.store.FlowShow(ctx, conn, id)
	if errors.Is(err, buckets.ErrNotFound) {
		return nil, refused(ErrNotFound, err, "workflow %s not found (never enqueued, or its retention passed)", id)
	}
	if err != nil {
		return nil, failed("workflow "+id, err)
	}
	return workflowInfo(fi), nil
}

func workflowInfo(fi *buckets.FlowInfo) *WorkflowInfo {
	wi := &WorkflowInfo{ID: fi.ID, Kind: fi.Kind, Created: fromMs(fi.Created), State: "running", StoppedAt: -1}
	var types []string // chain: every step's type, from the current step's record
	for i, r := range fi.Tasks {
		st := WorkflowStep{Index: i, ID: buckets.FlowStepID(fi.ID, i), State: "pending"}
		if r != nil {
			st.Type, st.State = r.Type, infoFromRecord(r, buckets.InRecord).State
			if r.State == buckets.StateWaiting || r.State == buckets.StateRetry {
				st.State = StateScheduled
				if r.State == buckets.StateRetry {
					st.State = StateRetrying
				}
			}
			if r.State == buckets.StateDead {
				st.Error = r.LastError
			}
			if r.Flow != nil && fi.Kind == "chain" {
				types = append(types[:0:0], make([]string, i+1)...)
				for _, n := range r.Flow.Next {
					types = append(types, n.Type)
				}
			}
		} else if o := fi.Outcomes[i]; o != nil {
			st.State, st.Error = State(o.State), o.Error
		}
		wi.Steps = append(wi.Steps, st)
	}
	for i := range wi.Steps {
		s := &wi.Steps[i]
		if s.Type == "" && i < len(types) {
			s.Type = types[i]
		}
	}
	switch fi.Kind {
	case "chain":
		last := -1
		for i, r := range fi.Tasks {
			if r != nil {
				last = i
			}
		}
		for i := range wi.Steps {
			if i < last && wi.Steps[i].State == "pending" {
				wi.Steps[i].State = "expired"
			}
		}
		switch {
		case fi.Ended != 0 && fi.Cancelled:
			wi.State = "cancelled"
		case fi.Ended != 0:
			wi.State = "done"
		case fi.Cancelled:
			wi.State = "cancelled"
		case last >= 0 && fi.Tasks[last].State == buckets.StateDead:
			wi.State, wi.StoppedAt = "stopped", last
		case last >= 0 && fi.Tasks[last].State == buckets.StateCancelled:
			wi.State, wi.StoppedAt = "cancelled", last
		}
	case "group":
		wi.Policy, wi.Final = fi.Policy, fi.Final
		cb := &WorkflowStep{ID: buckets.FlowCallbackID(fi.ID), State: "pending"}
		if fi.Callback != nil {
			cb.Type, cb.State = fi.Callback.Type, infoFromRecord(fi.Callback, buckets.InRecord).State
		}
		switch {
		case fi.Cancelled:
			wi.State = "cancelled"
		case fi.Fired == "-":
			wi.State = "done"
		case fi.Fired != "":
			wi.Callback = cb
			wi.State = groupStateAfterFire(fi.Callback)
		case fi.Final >= fi.Total:
			wi.State = "failed"
			wi.Callback = cb
		default:
			wi.Callback = cb
		}
	}
	return wi
}

// groupStateAfterFire is the state of a group whose callback was
// enqueued: the callback's own outcome. A callback whose record is gone
// ended and its retention passed.
func groupStateAfterFire(cb *buckets.Record) string {
	if cb == nil {
		return "done"
	}
	switch cb.State {
	case buckets.StateDone:
		return "done"
	case buckets.StateDead:
		return "failed"
	case buckets.StateCancelled:
		return "cancelled"
	}
	return "running"
}

// CancelWorkflow is Client.CancelWorkflow for one lane.
func (c *laneClient) CancelWorkflow(ctx context.Context, id string) (int, error) {
	if err := checkWorkflowID(id); err != nil {
		return 0, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	n, err := c.store.CancelFlow(ctx, conn, id, ms(c.cfg.Advanced.Clock.Now()), c.cfg.doneTTL())
	switch {
	case errors.Is(err, buckets.ErrFlowEnded):
		return n, &engineError{msg: fmt.Sprintf("engine: workflow %s already ended", id), kind: ErrAlreadyDone, cause: ErrAlreadyDone}
	case errors.Is(err, buckets.ErrNotFound):
		return n, refused(ErrNotFound, err, "workflow %s not found", id)
	case err != nil:
		return n, failed("cancel workflow "+id, err)
	}
	return n, nil
}

// Workflow is Inspector.Workflow for one lane.
func (in *laneInspector) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	return in.client().Workflow(ctx, id)
}
