package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

func checkCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustCheck(t *testing.T, c *laneClient, opts CheckOptions) *CheckReport {
	t.Helper()
	rep, err := c.Check(checkCtx(t, 30*time.Second), opts)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return rep
}

func describe(fs []CheckFinding) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "\n  %s: %s", f.Kind, f.Message)
	}
	return b.String()
}

// A namespace whose gauges were damaged and whose bucket lost its index
// member: the check names both, the repair fixes both, and a second check
// finds nothing.
func TestCheckFindsAndRepairsDamage(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := checkCtx(t, 30*time.Second)
	// One bucket for the three, enqueued together so that it is a list
	// (the damage is to a bucket list and its index member).
	due := time.Now().Add(time.Hour)
	var batch []NewTask
	for i := 0; i < 3; i++ {
		batch = append(batch, NewTask{Type: "t", Options: []Option{At(due)}})
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	if rep := mustCheck(t, c, CheckOptions{}); len(rep.Findings)+len(rep.Unconfirmed) > 0 {
		t.Fatalf("healthy namespace: findings%s", describe(append(rep.Findings, rep.Unconfirmed...)))
	}
	admin := e.admin(t)
	members, err := redis.Strings(admin.Do("ZRANGE", e.key("sched"), 0, -1))
	if err != nil || len(members) != 1 {
		t.Fatalf("index = %v, %v; want one bucket", members, err)
	}
	for _, cmd := range [][]interface{}{
		{"ZREM", e.key("sched"), members[0]},
		{"HINCRBY", e.key("st:default"), "running", 5},
		{"HINCRBY", e.key("st:default"), "scheduled", -2},
	} {
		if _, err := admin.Do(cmd[0].(string), cmd[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	rep := mustCheck(t, c, CheckOptions{})
	want := map[string]bool{"orphan-bucket " + e.key("b:"+members[0]): false,
		"gauge running 5 0": false, "gauge scheduled 1 3": false}
	for _, f := range rep.Findings {
		k := f.Kind + " " + f.Key
		if f.Kind == "gauge" {
			k = fmt.Sprintf("%s %s %d %d", f.Kind, f.Gauge, f.Stored, f.Counted)
		}
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected finding %s: %s", f.Kind, f.Message)
		}
		want[k] = true
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("finding %q missing; got%s", k, describe(rep.Findings))
		}
	}
	rep = mustCheck(t, c, CheckOptions{Repair: true})
	if rep.Repaired != len(rep.Findings) || len(rep.Remaining) != 0 {
		t.Fatalf("repair fixed %d of %d; remaining%s", rep.Repaired, len(rep.Findings), describe(rep.Remaining))
	}
	if rep := mustCheck(t, c, CheckOptions{}); len(rep.Findings)+len(rep.Unconfirmed) > 0 {
		t.Fatalf("after repair: findings%s", describe(append(rep.Findings, rep.Unconfirmed...)))
	}
	st, err := c.Stats(ctx)
	if err != nil || len(st) != 1 || st[0].Scheduled != 3 || st[0].Running != 0 {
		t.Fatalf("stats after repair = %+v, %v; want scheduled 3, running 0", st, err)
	}
	if n, err := redis.Int(admin.Do("ZCARD", e.key("sched"))); err != nil || n != 1 {
		t.Fatalf("index holds %d members (%v); want the bucket back", n, err)
	}
}

// Tasks that lost their place (a record whose id was removed from its
// list) are found by the key listing and put back.
func TestCheckRehomesHomelessTask(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := checkCtx(t, 30*time.Second)
	id, err := idOf(c.Enqueue(ctx, "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin(t).Do("LREM", e.key("q:default"), 0, id); err != nil {
		t.Fatal(err)
	}
	if rep := mustCheck(t, c, CheckOptions{NoKeyListing: true}); len(rep.Findings) != 0 {
		t.Fatalf("without the key listing a homeless record cannot be seen; got%s", describe(rep.Findings))
	}
	rep := mustCheck(t, c, CheckOptions{Repair: true})
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != "homeless" || rep.Findings[0].TaskID != id {
		t.Fatalf("findings%s; want task %s homeless", describe(rep.Findings), id)
	}
	if len(rep.Remaining) != 0 {
		t.Fatalf("remaining after repair%s", describe(rep.Remaining))
	}
	if ids := e.readyIDs(t, "default"); len(ids) != 1 || ids[0] != id {
		t.Fatalf("ready list = %v; want [%s]", ids, id)
	}
}

// A healthy namespace with tasks in every state reports nothing.
func TestCheckHealthyEveryState(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.RetryDelay = func(*Task, int, error) time.Duration { return time.Hour }
	c := e.client(t)
	ctx := checkCtx(t, 60*time.Second)
	release := make(chan struct{})
	var running atomic.Int32
	mux := NewMux()
	mux.HandleFunc("ok", func(context.Context, *Task) error { return nil })
	mux.HandleFunc("fail", func(context.Context, *Task) error { return errors.New("fails") })
	mux.HandleFunc("block", func(ctx context.Context, _ *Task) error {
		running.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	enq := func(typ string, opts ...Option) string {
		t.Helper()
		id, err := idOf(c.Enqueue(ctx, typ, nil, opts...))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	enq("ok")                             // done
	enq("fail", MaxAttempts(1))           // dead
	retry := enq("fail", MaxAttempts(3))  // retrying, in a bucket an hour away
	enq("block", Timeout(time.Minute))    // running
	enq("ok", In(time.Hour))              // scheduled
	cancelled := enq("ok", In(time.Hour)) // cancelled
	enq("ok", Queue("idle"))              // ready: no worker serves "idle"
	if err := c.Cancel(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "every state", func() bool {
		st, err := c.Stats(ctx)
		if err != nil {
			return false
		}
		var dead, retrying, processed int64
		for _, s := range st {
			dead += s.Dead
			retrying += s.Retrying
			processed += s.Processed
		}
		return dead == 1 && retrying == 1 && processed == 1 && running.Load() == 1
	})
	if info, err := c.Lookup(ctx, retry); err != nil || info.State != StateRetrying {
		t.Fatalf("Lookup(%s) = %+v, %v; want retrying", retry, info, err)
	}
	rep := mustCheck(t, c, CheckOptions{})
	if len(rep.Findings)+len(rep.Unconfirmed) > 0 {
		t.Fatalf("healthy namespace: findings%s", describe(append(rep.Findings, rep.Unconfirmed...)))
	}
	if rep.Tasks < 6 {
		t.Fatalf("check saw %d tasks; want at least 6", rep.Tasks)
	}
	close(release)
	stop()
}

// A check racing producers, dispatchers and workers reports no false
// finding: tasks in motion are never taken for damage.
func TestCheckRacingWorkload(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.DoneRetention = -1 // a namespace of bounded size: only the live tasks
	c := e.client(t)
	ctx := checkCtx(t, 90*time.Second)
	mux := NewMux()
	var n atomic.Int32
	mux.HandleFunc("t", func(context.Context, *Task) error {
		if n.Add(1)%7 == 0 {
			return errors.New("fails once in a while")
		}
		return nil
	})
	for i := 0; i < 2; i++ {
		srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
	}
	prodCtx, stopProducers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := 0; p < 3; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for i := 0; prodCtx.Err() == nil; i++ {
				select {
				case <-tick.C:
				case <-prodCtx.Done():
					return
				}
				var opts []Option
				if i%2 == 0 {
					opts = append(opts, In(time.Duration(i%40)*10*time.Millisecond))
				}
				if _, err := c.Enqueue(prodCtx, "t", nil, opts...); err != nil && prodCtx.Err() == nil {
					t.Errorf("enqueue: %v", err)
					return
				}
			}
		}()
	}
	checks, inMotion, unsettled, unconfirmed := 0, 0, 0, 0
	// At least 5 s and 5 checks; longer (on a loaded machine) until some
	// check has settled candidates that were in motion.
	start := time.Now()
	for time.Since(start) < 5*time.Second || checks < 5 || (inMotion+unconfirmed == 0 && time.Since(start) < 40*time.Second) {
		rep, err := c.Check(ctx, CheckOptions{})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		checks++
		inMotion += rep.InMotion
		if len(rep.Unconfirmed) > 0 {
			unsettled++
			unconfirmed += len(rep.Unconfirmed)
		}
		if len(rep.Findings) > 0 {
			t.Fatalf("check %d under load reported%s", checks, describe(rep.Findings))
		}
	}
	stopProducers()
	wg.Wait()
	if processed := n.Load(); processed == 0 {
		t.Fatal("the workload ran nothing while the checks ran")
	}
	// The checks must have met tasks in motion and kept them out of the
	// findings (cleared by the second walk, or left unconfirmed while they
	// kept moving), or this test proved nothing.
	if inMotion+unconfirmed == 0 {
		t.Fatalf("%d checks never met a task in motion", checks)
	}
	t.Logf("%d checks: %d candidates found in motion, %d checks could not settle, %d handler runs", checks, inMotion, unsettled, n.Load())
}

// Cancelling the only task of a bucket removes the bucket's index member
// with it, so the index never names an empty bucket (which the checker
// would report as stale); cancelling one of two keeps it.
func TestCancelLastOfBucketUnindexes(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := checkCtx(t, 10*time.Second)
	due := time.Now().Add(time.Hour)
	a, err := idOf(c.Enqueue(ctx, "t", nil, At(due)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := idOf(c.Enqueue(ctx, "t", nil, At(due)))
	if err != nil {
		t.Fatal(err)
	}
	members := func() int {
		n, err := redis.Int(e.admin(t).Do("ZCARD", e.key("sched")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := c.Cancel(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n := members(); n != 1 {
		t.Fatalf("after cancelling one of two: %d index members, want 1", n)
	}
	if err := c.Cancel(ctx, b); err != nil {
		t.Fatal(err)
	}
	if n := members(); n != 0 {
		t.Fatalf("after cancelling the last: %d index members, want 0", n)
	}
	if rep := mustCheck(t, c, CheckOptions{}); len(rep.Findings) != 0 {
		t.Fatalf("findings%s", describe(rep.Findings))
	}
}
