package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/redistest"
)

func mustAct(t *testing.T, what string, res ActionResult, err error, want ActionResult) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res != want {
		t.Fatalf("%s: %+v, want %+v", what, res, want)
	}
}

// Each action, for one task, a selection and a filter, does what it says,
// counts what it did, and leaves nothing for the checker to find.
func TestInspectActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	in, c := f.in, f.c
	ctx := checkCtx(t, 2*time.Minute)
	listIDs := func(s State, search string) []string {
		ids, _, _ := listAll(t, in, ListOptions{Filter: Filter{Queue: "work", State: s, Search: search}})
		return ids
	}

	// Run one scheduled task now: it is ready, next in line.
	res, err := in.Act(ctx, ActionRun, f.scheduled[2])
	mustAct(t, "run one", res, err, ActionResult{Done: 1})
	if ready := listIDs(StateReady, ""); len(ready) != 4 || ready[0] != f.scheduled[2] {
		t.Fatalf("after run: ready %v, want %s first of 4", ready, f.scheduled[2])
	}
	requireClean(t, c)

	// Retry a dead letter picked by a search, then the other by id.
	res, err = in.ActAll(ctx, ActionRetry, Filter{Queue: "work", State: StateDead, Search: "dead payload 1"})
	mustAct(t, "retry filter", res, err, ActionResult{Done: 1})
	requireClean(t, c)
	res, err = in.Act(ctx, ActionRetry, f.dead[0], f.retrying[0])
	mustAct(t, "retry selection", res, err, ActionResult{Done: 2})
	if ready := listIDs(StateReady, ""); !sameSet(ready, append([]string{f.scheduled[2], f.dead[0], f.dead[1], f.retrying[0]}, f.ready...)) {
		t.Fatalf("after retries: ready %v", ready)
	}
	if v, err := in.Task(ctx, f.dead[0]); err != nil || v.Attempts != 0 || v.State != StateReady {
		t.Fatalf("retried dead letter: %+v, %v", v, err)
	}
	requireClean(t, c)

	// Actions that do not apply are skipped and counted.
	res, err = in.Act(ctx, ActionRun, f.done[0], f.running[0], "no-such-task")
	mustAct(t, "run of tasks that cannot run", res, err, ActionResult{Skipped: 2, Missing: 1})
	res, err = in.Act(ctx, ActionCancel, f.running[0])
	mustAct(t, "cancel running", res, err, ActionResult{Skipped: 1})

	// Cancel one, then everything ready.
	res, err = in.Act(ctx, ActionCancel, f.ready[0])
	mustAct(t, "cancel one", res, err, ActionResult{Done: 1})
	res, err = in.ActAll(ctx, ActionCancel, Filter{Queue: "work", State: StateReady})
	mustAct(t, "cancel filter", res, err, ActionResult{Done: 6})
	if ready := listIDs(StateReady, ""); len(ready) != 0 {
		t.Fatalf("after cancel all: ready %v", ready)
	}
	if v, err := in.Task(ctx, f.ready[1]); err != nil || v.State != StateCancelled {
		t.Fatalf("cancelled task: %+v, %v", v, err)
	}
	requireClean(t, c)

	// Delete a running task: its worker's finish finds no record and
	// drops the result; the gauges stay exact.
	res, err = in.Act(ctx, ActionDelete, f.running[0])
	mustAct(t, "delete running", res, err, ActionResult{Done: 1})
	requireClean(t, c)
	f.releaseAll()
	f.waitStats(t, "the other running task done", func(q QueueInfo) bool { return q.Running == 0 && q.Processed == 3 })
	if _, err := in.Task(ctx, f.running[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted running task: %v, want ErrNotFound", err)
	}
	requireClean(t, c)

	// Delete everything scheduled, then every retry waiting in a bucket,
	// a selection of finished tasks, and a task in each remaining state
	// by id.
	res, err = in.ActAll(ctx, ActionDelete, Filter{Queue: "work", State: StateScheduled})
	mustAct(t, "delete filter", res, err, ActionResult{Done: 2})
	requireClean(t, c)
	res, err = in.ActAll(ctx, ActionDelete, Filter{Queue: "work", State: StateRetrying})
	mustAct(t, "delete retrying filter", res, err, ActionResult{Done: 1})
	q, err := in.Queue(ctx, "work")
	if err != nil || q.Scheduled != 0 || q.Retrying != 0 {
		t.Fatalf("after deleting the scheduled: %+v, %v", q, err)
	}
	requireClean(t, c)
	res, err = in.Act(ctx, ActionDelete, f.done[0], f.done[1], f.ready[1])
	mustAct(t, "delete selection", res, err, ActionResult{Done: 3})
	for _, id := range []string{f.done[0], f.ready[1]} {
		if _, err := in.Task(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted task %s: %v, want ErrNotFound", id, err)
		}
	}
	requireClean(t, c)
	redistest.RequireNoViolations(t, f.e.srv)
}

// Deleting ready tasks and dead letters, one by one and by filter.
func TestInspectDeleteReadyAndDead(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	in, c := f.in, f.c
	ctx := checkCtx(t, time.Minute)
	res, err := in.Act(ctx, ActionDelete, f.ready[0], f.dead[0], f.ready[0], f.running[0], f.running[0])
	mustAct(t, "delete ready, dead and running, some named twice", res, err, ActionResult{Done: 3})
	requireClean(t, c)
	res, err = in.ActAll(ctx, ActionDelete, Filter{State: StateDead})
	mustAct(t, "delete dead filter", res, err, ActionResult{Done: 1})
	res, err = in.ActAll(ctx, ActionDelete, Filter{Queue: "work", State: StateReady, Search: "ready payload"})
	mustAct(t, "delete ready filter", res, err, ActionResult{Done: 2})
	q, err := in.Queue(ctx, "work")
	if err != nil || q.Ready != 0 || q.Dead != 0 {
		t.Fatalf("after deletes: %+v, %v", q, err)
	}
	requireClean(t, c)
	if _, err := in.Act(ctx, Action("explode"), f.done[0]); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown action: %v", err)
	}
	if _, err := in.ActAll(ctx, ActionDelete, Filter{Queue: "work", State: StateDone}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("delete all done: %v, want ErrInvalid", err)
	}
}

// An action cut at any command (the connection closed before it, or after
// it with the reply lost) has done all of its batch or none of it, and
// leaves nothing for the checker to find.
func TestInspectActCrashPoints(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	in := c.inspector()
	st := e.store(t)
	// One bound for about a hundred cut-and-check rounds: on a loaded
	// machine they took more than two minutes.
	ctx := checkCtx(t, 10*time.Minute)
	for _, act := range []buckets.Action{buckets.ActRun, buckets.ActCancel, buckets.ActDelete} {
		for limit := 1; ; limit++ {
			tripped := false
			for _, lose := range []bool{false, true} {
				due := time.Now().Add(time.Hour)
				var ids []string
				for i := 0; i < 4; i++ {
					var opts []Option
					if i < 2 {
						opts = append(opts, At(due)) // one bucket for both
					}
					id, err := idOf(c.Enqueue(ctx, "t", nil, opts...))
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				conn, err := e.pool.GetContext(ctx)
				if err != nil {
					t.Fatal(err)
				}
				fc := &faultConn{Conn: conn, limit: limit, loseReply: lose}
				_, err = st.Act(ctx, fc, act, ids, time.Now().UnixMilli(), 3600, nil)
				conn.Close()
				tripped = tripped || fc.tripped()
				if err != nil && !fc.tripped() {
					t.Fatalf("%s limit %d: error without a fault: %v", act, limit, err)
				}
				states := make([]State, len(ids))
				for i, id := range ids {
					v, err := in.Task(ctx, id)
					switch {
					case errors.Is(err, ErrNotFound):
						states[i] = "gone"
					case err != nil:
						t.Fatal(err)
					default:
						states[i] = v.State
					}
				}
				before := []State{StateScheduled, StateScheduled, StateReady, StateReady}
				after := map[buckets.Action][]State{
					buckets.ActRun:    {StateReady, StateReady, StateReady, StateReady},
					buckets.ActCancel: {StateCancelled, StateCancelled, StateCancelled, StateCancelled},
					buckets.ActDelete: {"gone", "gone", StateCancelled, StateCancelled},
				}[act]
				if fmt.Sprint(states) != fmt.Sprint(before) && fmt.Sprint(states) != fmt.Sprint(after) {
					t.Fatalf("%s cut at command %d (reply lost %v): states %v, want all of %v or all of %v", act, limit, lose, states, before, after)
				}
				requireClean(t, c)
				// Clear the queue for the next round.
				if _, err := in.ActAll(ctx, ActionDelete, Filter{Queue: "default", State: StateReady}); err != nil {
					t.Fatal(err)
				}
				if _, err := in.ActAll(ctx, ActionDelete, Filter{Queue: "default", State: StateScheduled}); err != nil {
					t.Fatal(err)
				}
			}
			if !tripped {
				t.Logf("%s: cut at each of its %d commands", act, limit-1)
				break
			}
		}
	}
}
