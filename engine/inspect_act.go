package engine

import (
	"context"
	"fmt"

	"github.com/bucketq/bucketq/buckets"
)

// Action is what Act and ActAll do to tasks.
type Action string

// Actions.
const (
	// ActionRun makes a scheduled or retrying task ready now, at the
	// front of its queue. Other tasks are skipped.
	ActionRun Action = "run"
	// ActionRetry puts a dead task back at the front of its queue with
	// its attempts reset, and makes a retrying task ready now. Other
	// tasks are skipped.
	ActionRetry Action = "retry"
	// ActionCancel cancels a task that has not started (scheduled, ready,
	// retrying), as Client.Cancel does. Running and finished tasks are
	// skipped.
	ActionCancel Action = "cancel"
	// ActionDelete deletes a task in any state. A running task's worker
	// finds no record when it finishes and drops the result; a ready
	// task leaves a cancelled record saying "deleted" for an hour, so
	// that a worker that took it a moment before drops it.
	ActionDelete Action = "delete"
)

// maxActionBatch is the most tasks one transaction of Act or ActAll
// changes.
const maxActionBatch = buckets.MaxActBatch

// ActionResult counts what an action did.
type ActionResult struct {
	Done    int `json:"done"`    // tasks it applied to
	Skipped int `json:"skipped"` // tasks in a state it does not apply to
	Missing int `json:"missing"` // ids with no task
}

func (r *ActionResult) add(b buckets.ActResult) {
	r.Done += b.Done
	r.Skipped += b.Skipped
	r.Missing += b.Missing
}

func (a Action) store() (buckets.Action, error) {
	switch a {
	case ActionRun:
		return buckets.ActRun, nil
	case ActionRetry:
		return buckets.ActRetry, nil
	case ActionCancel:
		return buckets.ActCancel, nil
	case ActionDelete:
		return buckets.ActDelete, nil
	}
	return 0, fmt.Errorf("engine: action %q: want run, retry, cancel or delete: %w", string(a), ErrInvalid)
}

// Act is Inspector.Act for one lane.
func (in *laneInspector) Act(ctx context.Context, a Action, ids ...string) (ActionResult, error) {
	act, err := a.store()
	if err != nil {
		return ActionResult{}, err
	}
	for _, id := range ids {
		if err := checkID(id); err != nil {
			return ActionResult{}, err
		}
	}
	conn, err := in.conn(ctx)
	if err != nil {
		return ActionResult{}, err
	}
	defer conn.Close()
	var res ActionResult
	for len(ids) > 0 {
		batch := ids[:min(len(ids), maxActionBatch)]
		ids = ids[len(batch):]
		b, err := in.store.Act(ctx, conn, act, batch, ms(in.cfg.Advanced.Clock.Now()), in.cancelTTL(), nil)
		if err != nil {
			return res, failed(string(a)+" tasks", err)
		}
		res.add(b)
	}
	return res, nil
}

// ActAll is Inspector.ActAll for one lane.
func (in *laneInspector) ActAll(ctx context.Context, a Action, f Filter) (ActionResult, error) {
	act, err := a.store()
	if err != nil {
		return ActionResult{}, err
	}
	opts := ListOptions{Filter: f, Limit: maxActionBatch}
	if err := opts.check(); err != nil {
		return ActionResult{}, err
	}
	guard := stateGuard(f.State)
	var res ActionResult
	seen := map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return res, failed(string(a)+" tasks", err)
		}
		page, err := in.ListTasks(ctx, opts)
		if err != nil {
			return res, err
		}
		var ids []string
		for _, t := range page.Tasks {
			if !seen[t.ID] {
				seen[t.ID] = true
				ids = append(ids, t.ID)
			}
		}
		if len(ids) > 0 {
			b, err := in.actOn(ctx, act, ids, guard)
			if err != nil {
				return res, failed(string(a)+" tasks", err)
			}
			res.add(b)
		}
		if page.Next == "" {
			return res, nil
		}
		opts.Cursor = page.Next
	}
}

func (in *laneInspector) actOn(ctx context.Context, act buckets.Action, ids []string, guard func(*buckets.Record, bool) bool) (buckets.ActResult, error) {
	conn, err := in.conn(ctx)
	if err != nil {
		return buckets.ActResult{}, err
	}
	defer conn.Close()
	return in.store.Act(ctx, conn, act, ids, ms(in.cfg.Advanced.Clock.Now()), in.cancelTTL(), guard)
}

// stateGuard accepts the records that are in state s.
func stateGuard(s State) func(*buckets.Record, bool) bool {
	return func(r *buckets.Record, inBucket bool) bool {
		waiting := r.State == buckets.StateWaiting || r.State == buckets.StateRetry
		switch s {
		case StateScheduled:
			return r.State == buckets.StateWaiting && inBucket
		case StateRetrying:
			return r.State == buckets.StateRetry && inBucket
		case StateReady:
			return waiting && !inBucket
		case StateRunning:
			return r.State == buckets.StateRunning
		case StateDead:
			return r.State == buckets.StateDead
		}
		return false
	}
}

// cancelTTL is how long a cancelled record is kept, in seconds, as
// Client.Cancel keeps it.
func (in *laneInspector) cancelTTL() int64 { return in.cfg.doneTTL() }
