package buckets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// chainHead returns the first step of chain id of n steps, each of type
// "s<i>" on queue q, every later step asking for its predecessor's result.
func chainHead(id string, n int) *Record {
	r := newRec(FlowStepID(id, 0), t0)
	r.Type = "s0"
	f := &Flow{ID: id, Kind: FlowChain, Step: 0, Total: n}
	for i := 1; i < n; i++ {
		f.Next = append(f.Next, FlowStep{Queue: "q", Type: fmt.Sprintf("s%d", i), Payload: []byte(fmt.Sprint(i)),
			MaxAttempts: 2, TimeoutMs: 1000, PassResult: true})
	}
	r.Flow = f
	return r
}

func enqueueChain(id string, n int) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.EnqueueFlow(ctx, c, t0, id, ChainFields(n, t0), []*Record{chainHead(id, n)})
	}
}

// groupRecs returns group id's n members and its hash fields, with a
// callback of type "cb".
func groupRecs(id string, n int, policy string) ([]interface{}, []*Record) {
	var recs []*Record
	for i := range n {
		r := newRec(FlowStepID(id, i), t0)
		r.Flow = &Flow{ID: id, Kind: FlowMember, Step: i, Total: n}
		recs = append(recs, r)
	}
	cb := &Record{ID: FlowCallbackID(id), Queue: "q", Type: "cb", Payload: []byte("cb"), State: StateWaiting,
		MaxAttempts: 1, TimeoutMs: 1000}
	return GroupFields(n, t0, policy, cb.Encode()), recs
}

func enqueueGroup(id string, n int, policy string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		fields, recs := groupRecs(id, n, policy)
		return s.EnqueueFlow(ctx, c, t0, id, fields, recs)
	}
}

// claimNext pops and claims the next ready task of queue q under w.
func claimNext(ctx context.Context, s *Store, c redis.Conn, w string) (*Record, error) {
	id, err := s.Pop(ctx, c, "q", w)
	if err != nil || id == "" {
		return nil, fmt.Errorf("pop: %q, %v", id, err)
	}
	r, res, err := s.Claim(ctx, c, w, "q", id, t0+10, lease, false, nil)
	if err != nil || res != Claimed {
		return nil, fmt.Errorf("claim %s: %v, %v", id, res, err)
	}
	return r, nil
}

func finishAs(out Outcome, result string) func(*Record) Outcome {
	return func(r *Record) Outcome {
		switch out {
		case Done:
			r.Result = []byte(result)
		case Bury:
			r.LastError = "boom"
		}
		return out
	}
}

func mustRecord(t *testing.T, ctx context.Context, s *Store, c redis.Conn, id string) *Record {
	t.Helper()
	r, _, err := s.Lookup(ctx, c, id)
	if err != nil {
		t.Fatalf("lookup %s: %v", id, err)
	}
	return r
}

// A chain runs step after step, each result handed to the next step, and
// its hash is given the done retention when the last one succeeds.
func TestChainRunsInOrderPassingResults(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	s.FlowTTL = 600
	c := pool.Get()
	defer c.Close()
	if err := enqueueChain("c1", 3)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := claimNext(ctx, s, c, w1)
		if err != nil {
			t.Fatal(err)
		}
		if r.ID != FlowStepID("c1", i) || r.Flow == nil || r.Flow.Step != i {
			t.Fatalf("step %d: claimed %s (%+v)", i, r.ID, r.Flow)
		}
		if want := fmt.Sprintf("out%d", i-1); i > 0 && string(r.Flow.Input) != want {
			t.Fatalf("step %d: input %q, want %q", i, r.Flow.Input, want)
		}
		if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+20, 60, finishAs(Done, fmt.Sprintf("out%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != "" {
		t.Fatalf("a fourth task %s after the chain's last step", id)
	}
	fi, err := s.FlowShow(ctx, c, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Ended == 0 || len(fi.Tasks) != 3 || fi.Tasks[2] == nil || fi.Tasks[2].State != StateDone {
		t.Fatalf("show: %+v", fi)
	}
	if ttl, _ := redis.Int(c.Do("TTL", s.Keys.Workflow("c1"))); ttl <= 0 || ttl > 600 {
		t.Fatalf("chain hash TTL %d, want the flow retention", ttl)
	}
}

// A step run twice (its lease ran out and the reaper gave it to another
// worker) writes its successor once: the late finish of the first run
// finds the record no longer its own and writes nothing.
func TestChainSuccessorOnceUnderDoubleRun(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueChain("c2", 2)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	first, err := claimNext(ctx, s, c, "wA")
	if err != nil {
		t.Fatal(err)
	}
	// The lease of wA's run ends: the reaper returns the step.
	if res, err := s.Requeue(ctx, c, "wA", []string{first.ID}, t0+6000, LeaseExpired, 5); err != nil || res.Requeued != 1 {
		t.Fatalf("requeue: %+v, %v", res, err)
	}
	second, err := claimNext(ctx, s, c, "wB")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Finish(ctx, c, "wB", second.ID, second.Runs, t0+7000, 60, finishAs(Done, "b")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Finish(ctx, c, "wA", first.ID, first.Runs, t0+8000, 60, finishAs(Done, "a")); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the first run's finish: %v, want ErrLeaseLost", err)
	}
	ready, _ := redis.Strings(c.Do("LRANGE", s.Keys.Ready("q"), 0, -1))
	if len(ready) != 1 || ready[0] != FlowStepID("c2", 1) {
		t.Fatalf("ready list %v, want the successor once", ready)
	}
	if r := mustRecord(t, ctx, s, c, FlowStepID("c2", 1)); string(r.Flow.Input) != "b" {
		t.Fatalf("successor input %q, want the recorded run's result", r.Flow.Input)
	}
}

// A dead step stops its chain; revived from the dead letters and
// successful, it writes its successor, and the chain completes.
func TestChainDeadStepRevivedResumes(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueChain("c3", 3)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	r, _ := claimNext(ctx, s, c, w1)
	if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+20, 60, finishAs(Done, "x")); err != nil {
		t.Fatal(err)
	}
	r, _ = claimNext(ctx, s, c, w1)
	if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+30, 60, finishAs(Bury, "")); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != "" {
		t.Fatalf("%s ready after the chain's step died", id)
	}
	if n, err := reviveDead(ctx, s, c, []string{FlowStepID("c3", 1)}, t0+40); err != nil || n != 1 {
		t.Fatalf("revive: %d, %v", n, err)
	}
	for i := 1; i < 3; i++ {
		r, err := claimNext(ctx, s, c, w1)
		if err != nil || r.ID != FlowStepID("c3", i) {
			t.Fatalf("step %d: %v %v", i, r, err)
		}
		if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+50, 60, finishAs(Done, "y")); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := s.FlowShow(ctx, c, "c3"); err != nil || fi.Ended == 0 {
		t.Fatalf("show: %+v, %v", fi, err)
	}
}

// Cancelling a chain cancels its waiting step; a running step is marked,
// and its success writes no successor.
func TestCancelFlowChain(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueChain("c4", 3)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if err := enqueueChain("c5", 3)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	run, _ := claimNext(ctx, s, c, w1) // c4~0 runs
	n, err := s.CancelFlow(ctx, c, "c5", t0+20, 3600)
	if err != nil || n != 1 {
		t.Fatalf("cancel c5: %d, %v", n, err)
	}
	if r := mustRecord(t, ctx, s, c, FlowStepID("c5", 0)); r.State != StateCancelled {
		t.Fatalf("c5's step: %v", r.State)
	}
	if _, err := s.CancelFlow(ctx, c, "c4", t0+20, 3600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Finish(ctx, c, w1, run.ID, run.Runs, t0+30, 60, finishAs(Done, "")); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != "" {
		t.Fatalf("%s ready after its chain was cancelled", id)
	}
	if _, err := s.CancelFlow(ctx, c, "c4", t0+40, 3600); !errors.Is(err, ErrFlowEnded) {
		t.Fatalf("cancel of an ended chain: %v", err)
	}
}

func callbackInput(t *testing.T, ctx context.Context, s *Store, c redis.Conn, id string) []FlowOutcome {
	t.Helper()
	r := mustRecord(t, ctx, s, c, FlowCallbackID(id))
	var outs []FlowOutcome
	if err := json.Unmarshal(r.Flow.Input, &outs); err != nil {
		t.Fatalf("callback input %q: %v", r.Flow.Input, err)
	}
	return outs
}

// Members finishing at once on different connections (workers) enqueue
// the group's callback exactly once, with every outcome.
func TestGroupCallbackOnceUnderConcurrentFinishes(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	const n = 12
	for round := range 5 {
		id := fmt.Sprintf("g%d", round)
		if err := enqueueGroup(id, n, PolicyContinue)(ctx, s, c); err != nil {
			t.Fatal(err)
		}
		recs := make([]*Record, n)
		for i := range n {
			r, err := claimNext(ctx, s, c, fmt.Sprintf("w%d", i))
			if err != nil {
				t.Fatal(err)
			}
			recs[i] = r
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, n)
		for i, r := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn := pool.Get()
				defer conn.Close()
				<-start
				out := Done
				if i%4 == 3 {
					out = Bury
				}
				_, _, err := s.Finish(ctx, conn, r.Worker, r.ID, r.Runs, t0+20, 60, finishAs(out, fmt.Sprint(i)))
				errs <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		ready, _ := redis.Strings(c.Do("LRANGE", s.Keys.Ready("q"), 0, -1))
		if len(ready) != 1 || ready[0] != FlowCallbackID(id) {
			t.Fatalf("round %d: ready %v, want the callback once", round, ready)
		}
		c.Do("DEL", s.Keys.Ready("q"))
		outs := callbackInput(t, ctx, s, c, id)
		if len(outs) != n {
			t.Fatalf("%d outcomes, want %d", len(outs), n)
		}
		for i, o := range outs {
			want := "done"
			if i%4 == 3 {
				want = "dead"
			}
			if o.Index != i || o.State != want || (want == "done" && string(o.Result) != fmt.Sprint(i)) {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		}
	}
}

// PolicyFail: a dead member holds the callback back; retried from the
// dead letters and successful, it completes the group. PolicyContinue is
// covered above (dead members listed).
func TestGroupFailPolicy(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueGroup("gf", 2, PolicyFail)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	a, _ := claimNext(ctx, s, c, w1)
	b, _ := claimNext(ctx, s, c, w1)
	if _, _, err := s.Finish(ctx, c, w1, a.ID, a.Runs, t0+20, 60, finishAs(Done, "a")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Finish(ctx, c, w1, b.ID, b.Runs, t0+20, 60, finishAs(Bury, "")); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != "" {
		t.Fatalf("%s ready although a member died under PolicyFail", id)
	}
	fi, _ := s.FlowShow(ctx, c, "gf")
	if fi.Final != 2 || fi.OK != 1 || fi.Fired != "" {
		t.Fatalf("show: %+v", fi)
	}
	if n, err := reviveDead(ctx, s, c, []string{b.ID}, t0+30); err != nil || n != 1 {
		t.Fatalf("revive: %d %v", n, err)
	}
	b, _ = claimNext(ctx, s, c, w1)
	if _, _, err := s.Finish(ctx, c, w1, b.ID, b.Runs, t0+40, 60, finishAs(Done, "b")); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != FlowCallbackID("gf") {
		t.Fatalf("ready %q, want the callback", id)
	}
	if outs := callbackInput(t, ctx, s, c, "gf"); len(outs) != 2 || outs[1].State != "done" || string(outs[1].Result) != "b" {
		t.Fatalf("outcomes %+v", outs)
	}
}

// Two members of one group buried by one Requeue (recoveries used up)
// complete the group in that transaction.
func TestGroupMembersBuriedTogether(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueGroup("gr", 2, PolicyContinue)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	a, _ := claimNext(ctx, s, c, w1)
	b, _ := claimNext(ctx, s, c, w1)
	if res, err := s.Requeue(ctx, c, w1, []string{a.ID, b.ID}, t0+30, WorkerDied, 0); err != nil || res.Buried != 2 {
		t.Fatalf("requeue: %+v %v", res, err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != FlowCallbackID("gr") {
		t.Fatalf("ready %q, want the callback", id)
	}
	if outs := callbackInput(t, ctx, s, c, "gr"); len(outs) != 2 || outs[0].State != "dead" || outs[1].State != "dead" {
		t.Fatalf("outcomes %+v", outs)
	}
}

// A cancelled group never fires; its waiting members are cancelled.
func TestCancelFlowGroup(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	s.FlowTTL = 600
	c := pool.Get()
	defer c.Close()
	if err := enqueueGroup("gc", 3, PolicyContinue)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	a, _ := claimNext(ctx, s, c, w1)
	n, err := s.CancelFlow(ctx, c, "gc", t0+20, 3600)
	if err != nil || n != 2 {
		t.Fatalf("cancel: %d, %v", n, err)
	}
	if _, _, err := s.Finish(ctx, c, w1, a.ID, a.Runs, t0+30, 60, finishAs(Done, "")); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Pop(ctx, c, "q", w1); id != "" {
		t.Fatalf("%s ready after the group was cancelled", id)
	}
	fi, err := s.FlowShow(ctx, c, "gc")
	if err != nil || fi.Final != 3 || !fi.Cancelled || fi.Fired != "" {
		t.Fatalf("show: %+v %v", fi, err)
	}
	if ttl, _ := redis.Int(c.Do("TTL", s.Keys.Workflow("gc"))); ttl <= 0 {
		t.Fatalf("a cancelled group whose members all ended keeps its hash without a TTL (%d)", ttl)
	}
}

// A workflow id is taken while its hash exists.
func TestEnqueueFlowRefusesTakenID(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueChain("dup", 2)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	err := enqueueGroup("dup", 2, PolicyFail)(ctx, s, c)
	var ex *ExistsError
	if !errors.As(err, &ex) || len(ex.IDs) != 1 || ex.IDs[0] != "dup" {
		t.Fatalf("second workflow with the id: %v", err)
	}
}

// The inspector's cancel of a group's members completes the group as
// Cancel does.
func TestActCancelCompletesGroup(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueGroup("ga", 2, PolicyContinue)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	res, err := s.Act(ctx, c, ActCancel, []string{FlowStepID("ga", 0), FlowStepID("ga", 1)}, t0+10, 3600, nil)
	if err != nil || res.Done != 2 {
		t.Fatalf("act: %+v %v", res, err)
	}
	outs := callbackInput(t, ctx, s, c, "ga")
	if len(outs) != 2 || outs[0].State != "cancelled" || outs[1].State != "cancelled" {
		t.Fatalf("outcomes %+v", outs)
	}
}

// A member deleted by the inspector before it ended, and one whose record
// is destroyed while it runs (Abandon), still count for their group: its
// callback runs, listing them, instead of the group waiting for ever.
func TestDeletedAndAbandonedMembersCompleteGroup(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueueGroup("gd", 3, PolicyContinue)(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	// Two members running, one still waiting.
	running := map[string]*Record{}
	for _, w := range []string{"wa", "wb"} {
		r, err := claimNext(ctx, s, c, w)
		if err != nil {
			t.Fatal(err)
		}
		running[w] = r
	}
	var waiting string
	for i := range 3 {
		if id := FlowStepID("gd", i); id != running["wa"].ID && id != running["wb"].ID {
			waiting = id
		}
	}
	// The waiting member is deleted from the inspector.
	if res, err := s.Act(ctx, c, ActDelete, []string{waiting}, t0+20, 3600, nil); err != nil || res.Done != 1 {
		t.Fatalf("delete: %+v %v", res, err)
	}
	// One running member's record is deleted, the other's corrupted.
	if _, err := c.Do("DEL", s.Keys.Task(running["wa"].ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SET", s.Keys.Task(running["wb"].ID), "garbage"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"wa", "wb"} {
		if _, err := s.Abandon(ctx, c, w, running[w], t0+30); err != nil {
			t.Fatal(err)
		}
	}
	outs := callbackInput(t, ctx, s, c, "gd")
	if len(outs) != 3 {
		t.Fatalf("outcomes %+v; want 3", outs)
	}
	want := map[string]string{waiting: "cancelled", running["wa"].ID: "cancelled", running["wb"].ID: "dead"}
	for _, o := range outs {
		if o.State != want[o.ID] {
			t.Errorf("outcome of %s: %s (%q), want %s", o.ID, o.State, o.Error, want[o.ID])
		}
	}
}

// reviveDead retries dead letters as Inspector.Act does, and returns how
// many it revived.
func reviveDead(ctx context.Context, s *Store, c redis.Conn, ids []string, now int64) (int, error) {
	res, err := s.Act(ctx, c, ActRetry, ids, now, 3600, nil)
	return res.Done, err
}
