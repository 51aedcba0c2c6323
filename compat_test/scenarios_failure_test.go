package compat_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// scenarioRetries: failures are retried with backoff until they succeed,
// each run seeing the previous error; a timeout is a failure; Snooze
// runs again later without counting one; a task waiting for its retry is
// "retrying".
func scenarioRetries(e *env) {
	t, ctx := e.t, e.ctx
	var slowBackoff atomic.Bool
	cfg := e.cfg
	cfg.RetryDelay = func(*engine.Task, int, error) time.Duration {
		if slowBackoff.Load() {
			return time.Hour // the test makes it ready (ActionRun)
		}
		return 10 * time.Millisecond
	}
	c := e.client()
	var rec recorder
	mux := engine.NewMux()
	mux.HandleFunc("flaky", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if task.Attempt < 3 {
			return fmt.Errorf("flaky failure %d", task.Attempt)
		}
		return nil
	})
	mux.HandleFunc("later", func(ctx context.Context, task *engine.Task) error {
		if r := rec.add(task); len(rec.of(r.ID)) == 1 {
			return engine.Snooze(300 * time.Millisecond)
		}
		return nil
	})
	mux.HandleFunc("slow", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if task.Attempt == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	mux.HandleFunc("once", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if task.Attempt == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	_, stop := e.server(cfg, mux)

	flaky := must(t)(c.Enqueue(ctx, "flaky", nil, engine.MaxAttempts(5)))
	later := must(t)(c.Enqueue(ctx, "later", nil))
	slow := must(t)(c.Enqueue(ctx, "slow", nil, engine.Timeout(100*time.Millisecond), engine.MaxAttempts(3)))
	rec.waitRuns(t, 7)
	// A handler's run is recorded as it starts; its result a moment
	// after it returns.
	e.expectStats("default", "the results of the 7 runs recorded: 3 processed, 3 failed (flaky 2, slow 1)", func(st engine.QueueInfo) bool {
		return st.Processed == 3 && st.Failed == 3 && st.Running == 0
	})

	runs := rec.of(flaky)
	if len(runs) != 3 {
		t.Fatalf("flaky ran %d times, want 3", len(runs))
	}
	for i, r := range runs {
		wantErr := ""
		if i > 0 {
			wantErr = fmt.Sprintf("flaky failure %d", i)
		}
		if r.Attempt != i+1 || r.LastError != wantErr {
			t.Errorf("flaky run %d: attempt %d, last error %q; want attempt %d, last error %q", i, r.Attempt, r.LastError, i+1, wantErr)
		}
	}
	if info := e.lookup(c, flaky); info.State != engine.StateDone || info.Attempts != 2 {
		t.Errorf("flaky after success: state %s, attempts %d; want done, 2", info.State, info.Attempts)
	}

	runs = rec.of(later)
	if len(runs) != 2 {
		t.Fatalf("later ran %d times, want 2", len(runs))
	}
	if runs[1].Attempt != 1 || runs[1].LastError != "" {
		t.Errorf("Snooze counted as a failure: second run has attempt %d, last error %q", runs[1].Attempt, runs[1].LastError)
	}
	if gap := runs[1].At.Sub(runs[0].At); gap < 300*time.Millisecond {
		t.Errorf("Snooze(300ms) ran again after %v", gap)
	}

	runs = rec.of(slow)
	if len(runs) != 2 {
		t.Fatalf("slow ran %d times, want 2", len(runs))
	}
	if want := "timed out after 100ms: context deadline exceeded"; runs[1].LastError != want || runs[1].Attempt != 2 {
		t.Errorf("after a timeout: attempt %d, last error %q; want 2, %q", runs[1].Attempt, runs[1].LastError, want)
	}

	// With a long backoff the failed task is seen waiting as "retrying"
	// (an hour: nothing moves it while the test looks), until the
	// inspector makes it ready.
	slowBackoff.Store(true)
	once := must(t)(c.Enqueue(ctx, "once", nil))
	testwait.Until(t, outcomeWait, "the first run to fail", func() bool {
		return e.lookup(c, once).State == engine.StateRetrying
	})
	retryDue := e.lookup(c, once).Due // the retry's due time, as stored
	// The gauges are disjoint: a retry waiting in its bucket is retrying,
	// not also scheduled.
	if st := e.stats("default"); st.Retrying != 1 || st.Scheduled != 0 {
		t.Errorf("while a task waits for its retry: %d retrying, %d scheduled; want 1, 0", st.Retrying, st.Scheduled)
	}
	if info := e.lookup(c, once); info.Attempts != 1 || info.LastError != "first try fails" {
		t.Errorf("retrying task: attempts %d, last error %q", info.Attempts, info.LastError)
	}
	if gap := time.Until(retryDue); gap < 50*time.Minute {
		t.Errorf("retry due in %v, want about its 1h backoff", gap)
	}
	if res, err := e.inspector().Act(ctx, engine.ActionRun, once); err != nil || res.Done != 1 {
		t.Fatalf("run the retrying task now: %+v, %v", res, err)
	}
	testwait.Until(t, outcomeWait, "the retry to succeed", func() bool {
		return e.lookup(c, once).State == engine.StateDone
	})
	stop()
	runs = rec.of(once)
	if len(runs) != 2 || runs[1].Attempt != 2 {
		t.Fatalf("once ran %d times: %+v", len(runs), runs)
	}
	st := e.stats("default")
	if st.Processed != 4 || st.Failed != 4 || st.Dead != 0 || st.Retrying != 0 || st.Scheduled != 0 || st.Running != 0 {
		t.Errorf("stats %+v: want 4 processed, 4 failed (flaky 2, slow 1, once 1), nothing dead or waiting", st)
	}
}

// scenarioDeadLetters: tasks that exhaust their attempts, fail permanently,
// panic or have no handler go to the dead letters with their error; the
// dead letters can be listed, retried and purged.
func scenarioDeadLetters(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.UnknownType = "dead"
	cfg.Advanced.UnknownTypeGrace = -1 // no worker serves "nobody": no grace
	e.cfg = cfg
	c := e.client()
	var rec recorder
	var healed atomic.Bool
	mux := engine.NewMux()
	mux.HandleFunc("doomed", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if healed.Load() {
			return nil
		}
		return fmt.Errorf("doomed: attempt %d", task.Attempt)
	})
	mux.HandleFunc("fatal", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		return engine.Permanent(errors.New("bad input: no such account"))
	})
	mux.HandleFunc("panics", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		panic("kaboom")
	})
	_, stop := e.server(cfg, mux)

	doomed := must(t)(c.Enqueue(ctx, "doomed", nil, engine.MaxAttempts(3)))
	fatal := must(t)(c.Enqueue(ctx, "fatal", nil, engine.MaxAttempts(10)))
	panics := must(t)(c.Enqueue(ctx, "panics", nil, engine.MaxAttempts(1)))
	nobody := must(t)(c.Enqueue(ctx, "nobody", nil, engine.MaxAttempts(5)))
	in := e.inspector()
	testwait.Until(t, outcomeWait, "four dead letters", func() bool { return e.stats("default").Dead == 4 })
	rec.waitRuns(t, 5) // doomed 3, fatal 1, panics 1

	wantErr := map[string]func(string) bool{
		doomed: func(s string) bool { return s == "doomed: attempt 3" },
		fatal:  func(s string) bool { return s == "bad input: no such account" },
		panics: func(s string) bool {
			return strings.HasPrefix(s, "handler panic: kaboom\n") && strings.Contains(s, "goroutine ")
		},
		nobody: func(s string) bool { return s == `no handler for type "nobody": engine: no handler for task type` },
	}
	wantAttempts := map[string]int{doomed: 3, fatal: 1, panics: 1, nobody: 1}
	deadOnly := engine.Filter{State: engine.StateDead}
	all, err := in.ListTasks(ctx, engine.ListOptions{Filter: deadOnly, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	dead := all.Tasks
	if len(dead) != 4 || all.Total != 4 {
		t.Fatalf("dead letters: %d listed, total %d; want 4", len(dead), all.Total)
	}
	for i, d := range dead {
		if d.State != engine.StateDead || !wantErr[d.ID](d.LastError) || d.Attempts != wantAttempts[d.ID] || d.Finished.IsZero() {
			t.Errorf("dead letter %s (%s): state %s, attempts %d, error %q", d.ID, d.Type, d.State, d.Attempts, firstLine(d.LastError))
		}
		if i > 0 && d.Finished.After(dead[i-1].Finished) {
			t.Errorf("dead letters not newest first: %v after %v", d.Finished, dead[i-1].Finished)
		}
	}
	first, err := in.ListTasks(ctx, engine.ListOptions{Filter: deadOnly, Limit: 1})
	if err != nil || len(first.Tasks) != 1 || first.Next == "" {
		t.Fatalf("first page of 1: %+v, %v", first, err)
	}
	page, err := in.ListTasks(ctx, engine.ListOptions{Filter: deadOnly, Limit: 2, Cursor: first.Next})
	if err != nil || len(page.Tasks) != 2 || page.Tasks[0].ID != dead[1].ID || page.Tasks[1].ID != dead[2].ID {
		t.Errorf("the page after the first: %+v, %v; want the 2nd and 3rd", page, err)
	}
	for _, bad := range []int{-1, 1001} {
		if _, err := in.ListTasks(ctx, engine.ListOptions{Filter: deadOnly, Limit: bad}); !errors.Is(err, engine.ErrInvalid) {
			t.Errorf("ListTasks with limit %d: %v, want ErrInvalid", bad, err)
		}
	}
	act := func(a engine.Action, id string) engine.ActionResult {
		t.Helper()
		res, err := in.Act(ctx, a, id)
		if err != nil {
			t.Fatalf("%s %s: %v", a, id, err)
		}
		return res
	}
	if st := e.stats("default"); st.Dead != 4 || st.Failed != 6 || st.Processed != 0 {
		t.Errorf("stats %+v: want 4 dead, 6 failed (doomed 3, one each for the rest), 0 processed", st)
	}

	// Retry one: it runs again from attempt 1.
	healed.Store(true)
	if res := act(engine.ActionRetry, doomed); res.Done != 1 {
		t.Fatalf("retry the dead letter: %+v, want done 1", res)
	}
	testwait.Until(t, outcomeWait, "the revived task to succeed", func() bool {
		return e.lookup(c, doomed).State == engine.StateDone
	})
	if runs := rec.of(doomed); len(runs) != 4 || runs[3].Attempt != 1 {
		t.Errorf("revived task: %d runs, last attempt %d; want 4 runs, attempt 1", len(runs), runs[len(runs)-1].Attempt)
	}
	if res := act(engine.ActionRetry, doomed); res.Skipped != 1 {
		t.Errorf("retry of a done task: %+v, want skipped", res)
	}
	if res := act(engine.ActionRetry, uuid.NewString()); res.Missing != 1 {
		t.Errorf("retry of an unknown id: %+v, want missing", res)
	}

	// Delete one: it is gone.
	if res := act(engine.ActionDelete, fatal); res.Done != 1 {
		t.Fatalf("delete the dead letter: %+v", res)
	}
	if _, err := c.Lookup(ctx, fatal); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Lookup of a deleted task: %v, want ErrNotFound", err)
	}
	if res := act(engine.ActionDelete, fatal); res.Missing != 1 {
		t.Errorf("second delete: %+v, want missing", res)
	}

	// Retry all (no worker running): panics and nobody go back to the
	// queue, then run again and die again.
	stop()
	if res, err := in.ActAll(ctx, engine.ActionRetry, deadOnly); err != nil || res.Done != 2 {
		t.Fatalf("retry every dead letter: %+v, %v; want 2 done", res, err)
	}
	if st := e.stats("default"); st.Dead != 0 || st.Ready != 2 {
		t.Errorf("after retrying every dead letter: %d dead, %d ready; want 0, 2", st.Dead, st.Ready)
	}
	_, stop = e.server(cfg, mux)
	testwait.Until(t, outcomeWait, "the revived tasks to die again", func() bool {
		return e.stats("default").Dead == 2 && len(rec.of(panics)) == 2
	})
	if runs := rec.of(panics); runs[1].Attempt != 1 {
		t.Errorf("revived task ran with attempt %d, want 1", runs[1].Attempt)
	}
	stop()
	if res, err := in.ActAll(ctx, engine.ActionDelete, deadOnly); err != nil || res.Done != 2 {
		t.Errorf("delete every dead letter: %+v, %v; want 2 done", res, err)
	}
	if n := e.stats("default").Dead; n != 0 {
		t.Errorf("%d dead letters after deleting them all", n)
	}
	if res, err := in.ActAll(ctx, engine.ActionRetry, deadOnly); err != nil || res.Done != 0 {
		t.Errorf("retry every dead letter with none: %+v, %v", res, err)
	}
	st := e.stats("default")
	if st.Dead != 0 || st.Processed != 1 || st.Failed != 8 || st.Ready != 0 || st.Running != 0 {
		t.Errorf("final stats %+v: want 0 dead, 1 processed, 8 failed", st)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// scenarioLeaseExpiry: a handler that hangs past its timeout and lease is
// given up; the task runs again elsewhere (counted as a recovery) and the
// hung run's late result is dropped.
func scenarioLeaseExpiry(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Advanced.LeaseGrace = 300 * time.Millisecond
	cfg.Concurrency = 2
	c := e.client()
	var rec recorder
	release := make(chan struct{})
	var once sync.Once
	e.t.Cleanup(func() { once.Do(func() { close(release) }) })
	mux := engine.NewMux()
	mux.HandleFunc("hang", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if task.Recoveries == 0 {
			<-release // ignores its context: hung
		}
		return nil
	})
	_, stop := e.worker(cfg, mux)
	id := must(t)(c.Enqueue(ctx, "hang", nil, engine.Timeout(200*time.Millisecond)))
	testwait.Until(t, outcomeWait, "the first run", func() bool { return len(rec.of(id)) >= 1 })
	// Running, or (on a slow machine the lookup may come after timeout +
	// grace) already given up and returned: never anything else.
	first := e.lookup(c, id)
	if len(rec.of(id)) == 1 && first.State != engine.StateRunning && first.Recoveries == 0 {
		t.Errorf("hung task is %s with no recovery, want running (or returned after its lease)", first.State)
	}
	testwait.Until(t, outcomeWait, "the second run", func() bool { return len(rec.of(id)) >= 2 })
	testwait.Until(t, outcomeWait, "the second run to finish", func() bool {
		return e.lookup(c, id).State == engine.StateDone
	})
	once.Do(func() { close(release) }) // the hung run returns now; its result must be dropped
	// Stopping the worker waits for the released run and its result.
	stop()
	// Twice: the hung run and the one after it. On a machine so busy
	// that the second run too outlives its 500 ms lease, it is recovered
	// in its turn: each later run follows one more recovery, never a
	// failure.
	runs := rec.of(id)
	if len(runs) < 2 {
		t.Fatalf("hung task ran %d times, want 2", len(runs))
	}
	for i, r := range runs[1:] {
		if r.Recoveries != i+1 || r.Attempt != 1 {
			t.Errorf("run %d: recoveries %d, attempt %d; want %d, 1", i+2, r.Recoveries, r.Attempt, i+1)
		}
	}
	// Started is when the first run was claimed (in whole ms, rounded down);
	// its lease ends timeout + grace later.
	if gap := runs[1].At.Sub(first.Started); first.Recoveries == 0 && gap < 500*time.Millisecond {
		t.Errorf("task given up %v after its run started, before its timeout plus lease grace (500ms)", gap)
	}
	st := e.stats("default")
	if st.Recovered != int64(len(runs)-1) || st.Processed != 1 || st.Failed != 0 || st.Running != 0 {
		t.Errorf("stats %+v: want %d recovered, 1 processed (the late result dropped), 0 failed, 0 running", st, len(runs)-1)
	}
}

// scenarioShutdown: a graceful shutdown lets running handlers finish; past
// its deadline it cancels them and returns their tasks, uncounted, to the
// front of their queues; a stopped worker or server cannot run again, and
// leaves nothing for a reaper.
func scenarioShutdown(e *env) {
	t, ctx := e.t, e.ctx
	c := e.client()
	cfg := e.cfg
	cfg.Concurrency = 3

	// Graceful: the handlers finish.
	var rec recorder
	var finished atomic.Int32
	var ctxErrs sync.Map
	slowH := engine.HandlerFunc(func(hctx context.Context, task *engine.Task) error {
		rec.add(task)
		// real time: the run outlasts the call to Shutdown below, which
		// gives no sign of having started to wait.
		time.Sleep(400 * time.Millisecond)
		ctxErrs.Store(task.ID, hctx.Err())
		finished.Add(1)
		return nil
	})
	w, _ := e.worker(cfg, slowH)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, must(t)(c.Enqueue(ctx, "slow", nil)))
	}
	testwait.Until(t, outcomeWait, "three handlers to start", func() bool { return rec.len() == 3 })
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	if err := w.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	cancel()
	if n := finished.Load(); n != 3 {
		t.Errorf("Shutdown returned with %d of 3 handlers finished", n)
	}
	for _, id := range ids {
		if err, _ := ctxErrs.Load(id); err != nil {
			t.Errorf("graceful shutdown cancelled a handler's context: %v", err)
		}
		if info := e.lookup(c, id); info.State != engine.StateDone {
			t.Errorf("task %s after a graceful shutdown: %s, want done", id, info.State)
		}
	}
	if err := w.Run(ctx); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Run after Shutdown: %v, want ErrClosed", err)
	}
	if err := w.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}

	// Past the deadline: the handlers are cancelled, their tasks returned.
	var stuck recorder
	cancelled := make(chan error, 2)
	stuckH := engine.HandlerFunc(func(hctx context.Context, task *engine.Task) error {
		stuck.add(task)
		<-hctx.Done()
		cancelled <- hctx.Err()
		return hctx.Err()
	})
	w2, _ := e.worker(cfg, stuckH)
	a := must(t)(c.Enqueue(ctx, "stuck", nil))
	b := must(t)(c.Enqueue(ctx, "stuck", nil))
	testwait.Until(t, outcomeWait, "two stuck handlers to start", func() bool { return stuck.len() == 2 })
	sctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	// The deadline passed with handlers still running: Shutdown returns
	// the context's error, after giving their tasks back.
	if err := w2.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want DeadlineExceeded", err)
	}
	cancel()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Shutdown with a 300ms deadline took %v", d)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-cancelled:
			if err == nil {
				t.Errorf("handler context not cancelled")
			}
		case <-time.After(outcomeWait):
			t.Fatalf("the stuck handlers' contexts were not cancelled")
		}
	}
	for _, id := range []string{a, b} {
		if info := e.lookup(c, id); info.State != engine.StateReady || info.Attempts != 0 || info.Recoveries != 0 {
			t.Errorf("task returned at shutdown: state %s, attempts %d, recoveries %d; want ready, 0, 0", info.State, info.Attempts, info.Recoveries)
		}
	}
	if st := e.stats("default"); st.Ready != 2 || st.Running != 0 || st.Failed != 0 || st.Recovered != 0 {
		t.Errorf("stats after giving back %+v: want 2 ready, none running, failed or recovered", st)
	}

	// Another worker runs them, once each, from attempt 1.
	var again recorder
	_, stop3 := e.worker(cfg, again.handler())
	again.waitRuns(t, 2)
	stop3()
	again.exactlyOnce(t, []string{a, b})
	for _, r := range again.all() {
		if r.Attempt != 1 || r.Recoveries != 0 {
			t.Errorf("task given back at shutdown ran with attempt %d, recoveries %d; want 1, 0", r.Attempt, r.Recoveries)
		}
	}

	// Every worker unregistered itself: a reaper finds nothing to do.
	r, err := enginehook.NewReaper(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Reap(ctx); err != nil || res != (enginehook.ReapResult{}) {
		t.Errorf("Reap after clean shutdowns = %+v, %v; want nothing done", res, err)
	}

	// A whole server: Shutdown waits for Run, which cannot run again. The
	// property is the order, not the time: the env's 5 s ShutdownTimeout
	// was passed once on a Cluster while both cores were busy, so this
	// server has a minute, and the time it took is logged.
	scfg := e.cfg
	scfg.ShutdownTimeout = time.Minute
	s, err := engine.NewServer(scfg, again.handler(), engine.AllRoles, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(context.Background()) }()
	last := must(t)(c.Enqueue(ctx, "last", nil))
	testwait.Until(t, outcomeWait, "the server to run a task", func() bool { return len(again.of(last)) == 1 })
	sctx, cancel = context.WithTimeout(ctx, time.Minute)
	start = time.Now()
	if err := s.Shutdown(sctx); err != nil {
		t.Errorf("Server.Shutdown: %v", err)
	}
	cancel()
	t.Logf("Server.Shutdown took %v", time.Since(start))
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Server.Run: %v", err)
		}
	default:
		t.Errorf("Server.Shutdown returned before Run")
	}
	if err := s.Run(ctx); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Server.Run after Shutdown: %v, want ErrClosed", err)
	}
}

// scenarioIdleWake: idle workers and dispatchers block for IdleWait but
// new work wakes them: a batch of four tasks wakes four idle workers of one
// slot each, and an earlier scheduled task wakes the sleeping dispatcher.
// IdleWait is longer than any wait here, so a run at all proves a wake,
// however slow the machine.
func scenarioIdleWake(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Advanced.IdleWait = 2 * outcomeWait
	cfg.Concurrency = 1
	c := e.client()

	// On miniredis one idle worker: it wakes blocked clients one by one,
	// so a waiter that loops back into BLPOP quickly can take a second
	// token before the other blocked clients are served (Redis serves them
	// all at once after EXEC; 2.4 hands each push to a waiter at once).
	n := 4
	if e.kind.isMini() {
		n = 1
	}
	var rec recorder
	var running atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	mux := engine.NewMux()
	mux.HandleFunc("together", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		if running.Add(1) == int32(n) {
			once.Do(func() { close(all) })
		}
		// Each worker has one slot: all four run at once only if every
		// idle worker was woken.
		select {
		case <-all:
			return nil
		case <-time.After(outcomeWait):
			return errors.New("not every idle worker woke up")
		}
	})
	mux.HandleFunc("scheduled", rec.handler())
	blocked := e.trackBlocking()
	idle := func() bool { return blocked.workers.Load() == int64(n) && blocked.dispatchers.Load() == 1 }
	for i := 0; i < n; i++ {
		e.worker(cfg, mux)
	}
	e.dispatcher(cfg)
	blocked.changed.Until(t, outcomeWait, "every worker and the dispatcher blocked in BLPOP", idle)

	batch := make([]engine.NewTask, n)
	for i := range batch {
		batch[i] = engine.NewTask{Type: "together"}
	}
	start := time.Now()
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
		t.Logf("%d idle workers woke and ran together %v after the enqueue", n, time.Since(start).Round(time.Millisecond))
	case <-time.After(outcomeWait):
		t.Fatalf("only %d of %d idle workers woke within %v (IdleWait %v)", running.Load(), n, outcomeWait, cfg.Advanced.IdleWait)
	}

	blocked.changed.Until(t, outcomeWait, "every worker and the dispatcher blocked in BLPOP again", idle)
	start = time.Now()
	id := must(t)(c.Enqueue(ctx, "scheduled", nil, engine.In(300*time.Millisecond)))
	testwait.Until(t, outcomeWait, "the scheduled task to run before IdleWait", func() bool { return len(rec.of(id)) == 1 })
	d := time.Since(start)
	t.Logf("task scheduled 300ms ahead ran after %v", d.Round(time.Millisecond))
	if d < 300*time.Millisecond {
		t.Errorf("task scheduled 300ms ahead ran after %v, before its due time", d)
	}
	e.expectStats("default", fmt.Sprintf("%d processed, none failed or running", n+1), func(st engine.QueueInfo) bool {
		return st.Processed == int64(n+1) && st.Failed == 0 && st.Running == 0
	})
}

// scenarioLostMoveReply: a dispatcher whose move transaction gets no reply
// settles it (SettleMove, on a fresh connection) before it moves on. The
// seam loses the first move's reply before the EXEC reaches the server
// (the bucket is still there: a later round moves it) and the next move's
// after it ran (the task is in the ready list: settling writes nothing).
// The task runs once, on time. opts are the task's: a generated id makes
// it an inline entry, a chosen one (not of the generated shape) a bucket
// list, so that both kinds of move are settled.
func scenarioLostMoveReply(e *env, opts ...engine.Option) {
	t, ctx := e.t, e.ctx
	c := e.client()
	var rec recorder
	isMove := func(v txnView) bool {
		if !v.queues("ZREM") {
			return false
		}
		for _, q := range v.Queued {
			if q.is("LPUSH") && strings.HasSuffix(argString(q.Args[0]), "}:q:default") {
				return true
			}
		}
		return false
	}
	runner := e.admin() // runs the second move for real before its reply is lost
	var fired atomic.Int32
	var ran error
	e.faults.set(func(f *faults) {
		f.failExec = func(v txnView) error {
			if !isMove(v) {
				return nil
			}
			switch fired.Add(1) {
			case 1:
				return errLostConnection
			case 2:
				_ = runner.Send("MULTI")
				for _, q := range v.Queued {
					_ = runner.Send(q.Name, q.Args...)
				}
				_, ran = runner.Do("EXEC")
				return errLostConnection
			}
			return nil
		}
	})
	blocked := e.trackBlocking()
	_, stopW := e.worker(e.cfg, rec.handler())
	_, stopD := e.dispatcher(e.cfg)
	start := time.Now()
	id := must(t)(c.Enqueue(ctx, "x", nil, append([]engine.Option{engine.In(300 * time.Millisecond)}, opts...)...))
	rec.waitRuns(t, 1)
	d := time.Since(start)
	// A second copy would be in the ready list, or taken from it: once
	// the list is empty with the worker and the dispatcher both idle in
	// BLPOP, none can run any more.
	admin := e.admin()
	blocked.changed.Until(t, outcomeWait, "the worker and the dispatcher idle, nothing ready", func() bool {
		if blocked.workers.Load() == 0 || blocked.dispatchers.Load() == 0 {
			return false
		}
		n, err := redis.Int(admin.Do("LLEN", e.key("q:default")))
		return err == nil && n == 0
	})
	stopD()
	stopW()
	e.faults.set(nil)

	if n := fired.Load(); n < 2 {
		t.Fatalf("the seam lost %d move replies, want 2: the settling was not exercised", n)
	}
	if ran != nil {
		t.Fatalf("running the second move for the dispatcher: %v", ran)
	}
	rec.exactlyOnce(t, []string{id})
	if d < 300*time.Millisecond {
		t.Errorf("task scheduled 300ms ahead ran after %v", d)
	}
	t.Logf("two lost move replies settled; the task ran once, %v after it was scheduled", d.Round(time.Millisecond))
	e.expectStats("default", "1 processed, none scheduled or running", func(st engine.QueueInfo) bool {
		return st.Processed == 1 && st.Scheduled == 0 && st.Running == 0
	})
}

// scenarioDispatchTurn: two dispatchers over a backlog of one-task buckets
// many rounds deep take the dispatch turn (TakeTurn), move every task
// once, and give the turn up when nothing more is due (EndTurn).
func scenarioDispatchTurn(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Advanced.Resolution = time.Millisecond
	cfg.Advanced.DispatchBuckets = 2 // 16 buckets a round
	e.cfg = cfg
	c := e.client()
	const n = 100
	at := time.Now().Add(300 * time.Millisecond)
	tasks := make([]engine.NewTask, n)
	for i := range tasks {
		tasks[i] = engine.NewTask{Type: "x", Options: []engine.Option{engine.At(at.Add(time.Duration(i) * time.Millisecond))}}
	}
	ids, err := idsOf(c.EnqueueBatch(ctx, tasks))
	if err != nil {
		t.Fatal(err)
	}
	// Every bucket is due before a dispatcher first looks: the backlog
	// is n/16 rounds deep.
	// real time: the tasks' due times must have passed.
	time.Sleep(time.Until(at.Add(n*time.Millisecond + 100*time.Millisecond)))
	var rec recorder
	_, stopW := e.worker(cfg, rec.handler())
	_, stopD1 := e.dispatcher(cfg)
	_, stopD2 := e.dispatcher(cfg)
	rec.waitRuns(t, n)
	admin := e.admin()
	testwait.Until(t, 10*time.Second, "the dispatch turn to be let go after the backlog moved", func() bool {
		held, err := redis.Int(admin.Do("EXISTS", e.key("turn")))
		if err != nil {
			t.Fatal(err)
		}
		return held == 0
	})
	stopD1()
	stopD2()
	stopW()
	rec.exactlyOnce(t, ids)
	e.expectStats("default", fmt.Sprintf("%d processed, none scheduled or running", n), func(st engine.QueueInfo) bool {
		return st.Processed == n && st.Scheduled == 0 && st.Running == 0
	})
}
