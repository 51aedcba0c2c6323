package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runServer runs a Server (every role) for the test with mux.
func (e *env) runServer(t *testing.T, mux *Mux) {
	t.Helper()
	srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
}

// runWorker runs one more Worker process for the test with mux.
func (e *env) runWorker(t *testing.T, mux *Mux) {
	t.Helper()
	w, err := newWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
}

func workflowState(t *testing.T, c *laneClient, id, want string) func() bool {
	return func() bool {
		wf, err := c.Workflow(t.Context(), id)
		if err != nil {
			t.Fatalf("workflow %s: %v", id, err)
		}
		return wf.State == want
	}
}

// A chain whose middle step dies stops there; retried from the dead
// letters, the step succeeds and the chain completes, every step once.
func TestChainMiddleStepDiesRetriedCompletes(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	var runs [3]atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	got := make(chan string, 1)
	mux := NewMux()
	for i := range 3 {
		mux.HandleFunc(fmt.Sprintf("s%d", i), func(ctx context.Context, task *Task) error {
			runs[i].Add(1)
			if i == 1 && fail.Load() {
				return Permanent(errors.New("bad input"))
			}
			if i == 2 {
				got <- string(task.Workflow.Input)
			}
			return SetResult(ctx, append(task.Workflow.Input, byte('a'+i)))
		})
	}
	e.runServer(t, mux)
	if _, err := c.EnqueueChain(t.Context(), "ch", Step{Type: "s0"}, Step{Type: "s1", PassResult: true},
		Step{Type: "s2", PassResult: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the chain to stop at its dead step", workflowState(t, c, "ch", "stopped"))
	wf, _ := c.Workflow(t.Context(), "ch")
	if wf.StoppedAt != 1 || wf.Steps[1].State != StateDead || wf.Steps[2].State != "pending" || wf.Steps[2].Type != "s2" {
		t.Fatalf("stopped chain: %+v", wf)
	}
	info, err := c.Lookup(t.Context(), "ch~1")
	if err != nil || info.Workflow == nil || info.Workflow.ID != "ch" || info.Workflow.Index != 1 || info.Workflow.Kind != "chain" {
		t.Fatalf("lookup of the dead step: %+v %v", info, err)
	}
	fail.Store(false)
	retryDead(t, c, "ch~1")
	if in := <-got; in != "ab" {
		t.Fatalf("last step's input %q, want the results passed along", in)
	}
	waitFor(t, outcomeWait, "the chain to complete", workflowState(t, c, "ch", "done"))
	if runs[0].Load() != 1 || runs[1].Load() != 2 || runs[2].Load() != 1 {
		t.Fatalf("runs %d %d %d, want 1 2 1", runs[0].Load(), runs[1].Load(), runs[2].Load())
	}
}

// A step whose first run outlives its lease runs again elsewhere; the
// second run's success writes the successor, and the first run's late
// success writes nothing: the successor runs once. (The store's own
// guard, a finish that finds the record no longer its run's, is tested
// in buckets: TestChainSuccessorOnceUnderDoubleRun.)
func TestChainSuccessorOnceUnderLeaseLoss(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	var late atomic.Int32
	e.cfg.Logger = slog.New(msgCounter{"handler returned after its task was given back", &late})
	e.cfg.Advanced.LeaseGrace = 50 * time.Millisecond
	release := make(chan struct{})
	var next atomic.Int32
	nextDone := make(chan struct{})
	mux := NewMux()
	mux.HandleFunc("first", func(_ context.Context, task *Task) error {
		if task.Run == 1 {
			<-release // hung past its lease, ignoring its context
		}
		return nil
	})
	mux.HandleFunc("next", func(context.Context, *Task) error {
		if next.Add(1) == 1 {
			close(nextDone)
		}
		return nil
	})
	c := e.client(t)
	if _, err := c.EnqueueChain(t.Context(), "ll", Step{Type: "first", Options: []Option{Timeout(50 * time.Millisecond)}},
		Step{Type: "next"}); err != nil {
		t.Fatal(err)
	}
	e.runWorker(t, mux)
	e.runWorker(t, mux)
	select {
	case <-nextDone:
	case <-time.After(outcomeWait):
		t.Fatal("the successor never ran")
	}
	close(release) // the first run returns success now: its result is not recorded
	waitFor(t, outcomeWait, "the first run's late result to be dropped", func() bool { return late.Load() > 0 })
	waitFor(t, outcomeWait, "the chain to complete", workflowState(t, c, "ll", "done"))
	info, err := c.Lookup(t.Context(), "ll~0")
	if err != nil || info.Run != 2 {
		t.Fatalf("first step: %+v %v, want two runs", info, err)
	}
	info, err = c.Lookup(t.Context(), "ll~1")
	if err != nil || info.Run != 1 || next.Load() != 1 {
		t.Fatalf("successor: run %d, handler runs %d, err %v; want once", info.Run, next.Load(), err)
	}
}

// Members finishing together on several workers enqueue the callback
// once, with every outcome.
func TestGroupCallbackOnceAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const n = 40
	var callbacks atomic.Int32
	outcomes := make(chan []Outcome, 2)
	start := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	mux := NewMux()
	mux.HandleFunc("member", func(ctx context.Context, task *Task) error {
		if task.Run == 1 {
			started.Done()
		}
		<-start // every member finishes at the same moment
		return SetResult(ctx, []byte(task.ID))
	})
	mux.HandleFunc("done", func(_ context.Context, task *Task) error {
		callbacks.Add(1)
		outcomes <- task.Workflow.Outcomes
		return nil
	})
	e.cfg.Concurrency = n/4 + 1
	for range 4 {
		e.runWorker(t, mux)
	}
	members := make([]Step, n)
	for i := range members {
		members[i] = Step{Type: "member"}
	}
	c := e.client(t)
	if _, err := c.EnqueueGroup(t.Context(), Group{ID: "g", Members: members, Callback: &Step{Type: "done"}}); err != nil {
		t.Fatal(err)
	}
	started.Wait()
	close(start)
	outs := <-outcomes
	if len(outs) != n {
		t.Fatalf("%d outcomes, want %d", len(outs), n)
	}
	for i, o := range outs {
		if o.Index != i || o.State != StateDone || string(o.Result) != fmt.Sprintf("g~%d", i) {
			t.Fatalf("outcome %d: %+v", i, o)
		}
	}
	waitFor(t, outcomeWait, "the callback to be done", func() bool {
		info, err := c.Lookup(t.Context(), "g~cb")
		return err == nil && info.State == StateDone
	})
	info, _ := c.Lookup(t.Context(), "g~cb")
	if callbacks.Load() != 1 || info.Run != 1 {
		t.Fatalf("callback ran %d times (record run %d), want once", callbacks.Load(), info.Run)
	}
}

// By default a dead member holds the callback back (the group is failed);
// retried from the dead letters and successful, it completes the group.
// With ContinueOnFailure the callback runs with the dead member listed.
func TestGroupDeadMemberPolicies(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	var fail atomic.Bool
	fail.Store(true)
	callbacks := make(chan *Task, 4)
	mux := NewMux()
	mux.HandleFunc("m", func(_ context.Context, task *Task) error {
		if string(task.Payload) == "bad" && fail.Load() {
			return Permanent(errors.New("no"))
		}
		return nil
	})
	mux.HandleFunc("cb", func(_ context.Context, task *Task) error { callbacks <- task; return nil })
	e.runServer(t, mux)
	c := e.client(t)
	members := []Step{{Type: "m"}, {Type: "m", Payload: []byte("bad")}}
	if _, err := c.EnqueueGroup(t.Context(), Group{ID: "cont", Members: members, Callback: &Step{Type: "cb"}, ContinueOnFailure: true}); err != nil {
		t.Fatal(err)
	}
	task := <-callbacks
	if w := task.Workflow; !w.Callback || len(w.Outcomes) != 2 || w.Outcomes[1].State != StateDead || w.Outcomes[1].Error != "no" {
		t.Fatalf("ContinueOnFailure callback: %+v", task.Workflow)
	}
	if _, err := c.EnqueueGroup(t.Context(), Group{ID: "fail", Members: members, Callback: &Step{Type: "cb"}, ContinueOnFailure: false}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the group to fail", workflowState(t, c, "fail", "failed"))
	if len(callbacks) != 0 {
		t.Fatal("a failed group ran its callback with a dead member")
	}
	fail.Store(false)
	retryDead(t, c, "fail~1")
	task = <-callbacks
	if w := task.Workflow; w.ID != "fail" || len(w.Outcomes) != 2 || w.Outcomes[1].State != StateDone {
		t.Fatalf("failed group callback after the retry: %+v", task.Workflow)
	}
	waitFor(t, outcomeWait, "the group to be done", workflowState(t, c, "fail", "done"))
}

// Cancelling a chain cancels its waiting step; the workflow shows it.
func TestCancelWorkflow(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	if _, err := c.EnqueueChain(t.Context(), "later", Step{Type: "x", Delay: time.Hour}, Step{Type: "y"}); err != nil {
		t.Fatal(err)
	}
	n, err := c.CancelWorkflow(t.Context(), "later")
	if err != nil || n != 1 {
		t.Fatalf("cancel: %d %v", n, err)
	}
	wf, err := c.Workflow(t.Context(), "later")
	if err != nil || wf.State != "cancelled" || wf.Steps[0].State != StateCancelled {
		t.Fatalf("cancelled chain: %+v %v", wf, err)
	}
	if _, err := c.CancelWorkflow(t.Context(), "later"); !errors.Is(err, ErrAlreadyDone) {
		t.Fatalf("second cancel: %v", err)
	}
	if _, err := c.CancelWorkflow(t.Context(), "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancel of no workflow: %v", err)
	}
}

// Limits and options are checked before anything is written.
func TestWorkflowLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	c := e.client(t)
	ctx := t.Context()
	steps := make([]Step, maxChainSteps+1)
	for i := range steps {
		steps[i] = Step{Type: "x"}
	}
	if _, err := c.EnqueueChain(ctx, "long", steps...); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many steps: %v", err)
	}
	if _, err := c.EnqueueChain(ctx, "none"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("no step: %v", err)
	}
	members := make([]Step, maxGroupMembers+1)
	for i := range members {
		members[i] = Step{Type: "x"}
	}
	if _, err := c.EnqueueGroup(ctx, Group{ID: "big", Members: members}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many members: %v", err)
	}
	if _, err := c.EnqueueChain(ctx, "opt", Step{Type: "x", Options: []Option{TaskID("mine")}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("TaskID in a step: %v", err)
	}
	if _, err := c.EnqueueChain(ctx, "opt", Step{Type: "x", Options: []Option{In(time.Hour)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("In in a step: %v", err)
	}
	if _, err := c.EnqueueChain(ctx, strings.Repeat("x", maxWorkflowIDLen+1), Step{Type: "x"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("long id: %v", err)
	}
	if _, err := c.EnqueueChain(ctx, "bad", Step{Type: ""}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty type: %v", err)
	}
	if _, err := c.Workflow(ctx, "long"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused workflow was written: %v", err)
	}
}

// msgCounter is a logger that counts the records whose message contains
// sub.
type msgCounter struct {
	sub string
	n   *atomic.Int32
}

func (h msgCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h msgCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h msgCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h msgCounter) WithGroup(string) slog.Handler      { return h }

// A chain whose waiting step is cancelled by itself (Cancel of the step's
// id) is cancelled, not done.
func TestChainStepCancelledAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	c := e.client(t)
	if _, err := c.EnqueueChain(t.Context(), "solo", Step{Type: "x", Delay: time.Hour}, Step{Type: "y"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(t.Context(), "solo~0"); err != nil {
		t.Fatal(err)
	}
	wf, err := c.Workflow(t.Context(), "solo")
	if err != nil || wf.State != "cancelled" {
		t.Fatalf("chain after its step's cancel: %+v %v", wf, err)
	}
}

// A group is running until its callback has ended, and then takes the
// callback's outcome: done when it succeeded, failed when it is dead.
func TestGroupStateFollowsCallback(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	release := make(chan struct{})
	running := make(chan struct{}, 1)
	mux := NewMux()
	mux.HandleFunc("m", func(context.Context, *Task) error { return nil })
	mux.HandleFunc("cb", func(context.Context, *Task) error {
		running <- struct{}{}
		<-release
		return nil
	})
	mux.HandleFunc("badcb", func(context.Context, *Task) error { return Permanent(errors.New("cannot report")) })
	e.runServer(t, mux)
	c := e.client(t)
	if _, err := c.EnqueueGroup(t.Context(), Group{ID: "slow", Members: []Step{{Type: "m"}}, Callback: &Step{Type: "cb"}}); err != nil {
		t.Fatal(err)
	}
	<-running
	wf, err := c.Workflow(t.Context(), "slow")
	if err != nil || wf.State != "running" || wf.Callback == nil || wf.Callback.State != StateRunning {
		t.Fatalf("group while its callback runs: %+v %v; want running", wf, err)
	}
	close(release)
	waitFor(t, outcomeWait, "the group to be done", workflowState(t, c, "slow", "done"))
	if wf, _ := c.Workflow(t.Context(), "slow"); wf.Callback == nil || wf.Callback.State != StateDone {
		t.Fatalf("done group's callback: %+v", wf.Callback)
	}
	if _, err := c.EnqueueGroup(t.Context(), Group{ID: "bad", Members: []Step{{Type: "m"}}, Callback: &Step{Type: "badcb"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the group to fail", workflowState(t, c, "bad", "failed"))
	if wf, _ := c.Workflow(t.Context(), "bad"); wf.Callback == nil || wf.Callback.State != StateDead {
		t.Fatalf("failed group's callback: %+v", wf.Callback)
	}
}
