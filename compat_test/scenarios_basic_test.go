package compat_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// scenarioEnqueue: immediate tasks, one by one and in a batch, on two
// queues, each run exactly once with its payload; bad input is refused
// before anything is written.
func scenarioEnqueue(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.MaxPayload = 1024
	cfg.Queues = []engine.QueueConfig{{Name: "default"}, {Name: "other"}}
	e.cfg = cfg
	c := e.client()

	// Refused before anything is written.
	for _, tc := range []struct {
		name string
		typ  string
		data []byte
		opts []engine.Option
		want error
	}{
		{"empty type", "", nil, nil, engine.ErrInvalid},
		{"bad queue", "echo", nil, []engine.Option{engine.Queue("no spaces")}, engine.ErrInvalid},
		{"payload too large", "echo", make([]byte, 1025), nil, engine.ErrTooLarge},
		{"max attempts 0", "echo", nil, []engine.Option{engine.MaxAttempts(0)}, engine.ErrInvalid},
	} {
		if _, err := c.Enqueue(ctx, tc.typ, tc.data, tc.opts...); !errors.Is(err, tc.want) {
			t.Errorf("Enqueue with %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := c.EnqueueBatch(ctx, []engine.NewTask{{Type: "echo"}, {Type: ""}}); !errors.Is(err, engine.ErrInvalid) {
		t.Errorf("EnqueueBatch with one bad task: %v, want ErrInvalid", err)
	}
	if st, err := e.inspector().Queues(ctx); err != nil || len(st) != 0 {
		t.Errorf("after refused enqueues Queues = %v, %v; want no queue at all", st, err)
	}
	if _, err := c.Lookup(ctx, uuid.NewString()); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Lookup of an unknown id: %v, want ErrNotFound", err)
	}
	if _, err := c.Lookup(ctx, "not-an-id"); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Lookup of a malformed id: %v, want ErrNotFound", err)
	}

	payload := map[string]string{}
	queue := map[string]string{}
	var ids []string
	for i := 0; i < 30; i++ {
		p := fmt.Sprintf("one-%d", i)
		id := must(t)(c.Enqueue(ctx, "echo", []byte(p)))
		ids, payload[id], queue[id] = append(ids, id), p, "default"
	}
	var batch []engine.NewTask
	for i := 0; i < 30; i++ {
		var opts []engine.Option
		if i%2 == 1 {
			opts = append(opts, engine.Queue("other"))
		}
		batch = append(batch, engine.NewTask{Type: "echo", Payload: []byte(fmt.Sprintf("batch-%d", i)), Options: opts})
	}
	bids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil || len(bids) != len(batch) {
		t.Fatalf("EnqueueBatch: %v ids, %v", len(bids), err)
	}
	for i, id := range bids {
		ids, payload[id], queue[id] = append(ids, id), string(batch[i].Payload), "default"
		if i%2 == 1 {
			queue[id] = "other"
		}
	}
	// Nothing runs yet: every task is ready and counted so.
	if st := e.stats("default"); st.Ready != 45 || st.Scheduled != 0 {
		t.Errorf("before any worker: default has %d ready, %d scheduled; want 45, 0", st.Ready, st.Scheduled)
	}
	if info := e.lookup(c, ids[0]); info.State != engine.StateReady {
		t.Errorf("task not yet run: state %s, want ready", info.State)
	}

	var rec recorder
	_, stop := e.server(e.cfg, rec.handler())
	rec.waitRuns(t, len(ids))
	stop()
	rec.exactlyOnce(t, ids)
	for _, r := range rec.all() {
		if r.Payload != payload[r.ID] || r.Type != "echo" || r.Queue != queue[r.ID] || r.Attempt != 1 {
			t.Errorf("run %+v: want payload %q, type echo, queue %s, attempt 1", r, payload[r.ID], queue[r.ID])
		}
	}
	for _, id := range ids[:5] {
		if info := e.lookup(c, id); info.State != engine.StateDone || info.Attempts != 0 || info.Finished.IsZero() {
			t.Errorf("task %s after its run: state %s, attempts %d, finished %v; want done, 0, set", id, info.State, info.Attempts, info.Finished)
		}
	}
	for q, n := range map[string]int64{"default": 45, "other": 15} {
		st := e.stats(q)
		if st.Processed != n || st.Ready != 0 || st.Running != 0 || st.Scheduled != 0 || st.Failed != 0 {
			t.Errorf("queue %s stats %+v: want processed %d and nothing ready, running, scheduled or failed", q, st, n)
		}
	}
}

// scenarioSchedule: delayed and scheduled tasks never run before their due
// time on the producer's clock, and run soon after it.
func scenarioSchedule(e *env) {
	t, ctx := e.t, e.ctx
	e.cfg.Advanced.Resolution = 50 * time.Millisecond // buckets wider than the gaps between due times
	c := e.client()

	var rec recorder
	_, stop := e.server(e.cfg, rec.handler())

	// The producer computes each due time on its clock (the real one, as
	// the handler's): [lo, hi] brackets it from outside the call.
	type bounds struct{ lo, hi time.Time }
	due := map[string]bounds{}
	var ids []string
	add := func(id string, lo, hi time.Time) { ids, due[id] = append(ids, id), bounds{lo, hi} }
	start := time.Now()
	for i := 0; i < 20; i++ {
		d := time.Duration(i*37) * time.Millisecond
		before := time.Now()
		id := must(t)(c.Enqueue(ctx, "tick", nil, engine.In(d)))
		add(id, before.Add(d), time.Now().Add(d))
	}
	for i := 0; i < 10; i++ {
		at := time.Now().Add(time.Duration(100+i*61) * time.Millisecond)
		add(must(t)(c.Enqueue(ctx, "tick", nil, engine.At(at))), at, at)
	}
	var batch []engine.NewTask
	batchAt := time.Now()
	for i := 0; i < 10; i++ {
		opt := engine.In(time.Duration(i*83) * time.Millisecond)
		if i%2 == 1 {
			opt = engine.At(batchAt.Add(time.Duration(i*83) * time.Millisecond))
		}
		batch = append(batch, engine.NewTask{Type: "tick", Options: []engine.Option{opt}})
	}
	bids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range bids {
		d := time.Duration(i*83) * time.Millisecond
		if i%2 == 1 {
			add(id, batchAt.Add(d), batchAt.Add(d))
		} else {
			add(id, batchAt.Add(d), time.Now().Add(d))
		}
	}
	// A time in the past is kept as given, and the task is due at once.
	pastAt := time.Now().Add(-time.Hour)
	past := must(t)(c.Enqueue(ctx, "tick", nil, engine.At(pastAt)))
	add(past, pastAt, pastAt)
	// One far in the future stays scheduled.
	far := must(t)(c.Enqueue(ctx, "later", nil, engine.In(time.Hour)))
	farDue := time.Now().Add(time.Hour)
	if info := e.lookup(c, far); info.State != engine.StateScheduled || info.Due.Before(farDue.Add(-time.Minute)) {
		t.Errorf("task due in an hour: state %s, due %v; want scheduled, in an hour", info.State, info.Due)
	}

	rec.waitRuns(t, len(ids))
	stop()
	rec.exactlyOnce(t, ids)
	var worst time.Duration
	for _, r := range rec.all() {
		b := due[r.ID]
		// Due times are kept in whole milliseconds (either rounding).
		if r.Due.Before(b.lo.Truncate(time.Millisecond)) || r.Due.After(b.hi.Truncate(time.Millisecond).Add(time.Millisecond)) {
			t.Errorf("task %s: due %v, outside the producer's [%v, %v]", r.ID, r.Due, b.lo, b.hi)
		}
		// Never early: not before the time the producer asked for (exact
		// for At, a lower bound for In), nor before the due time recorded.
		if r.At.Before(b.lo) || r.At.Before(r.Due) {
			t.Errorf("task %s ran at %v, before its due time %v (recorded %v)", r.ID, r.At.Format(time.StampMicro),
				b.lo.Format(time.StampMicro), r.Due.Format(time.StampMilli))
		}
		if late := r.At.Sub(r.Due); late > worst && r.ID != past {
			worst = late
		}
	}
	// How late is the machine's as much as the engine's: the lateness
	// target is the bench's (bench/scenario_lateness.go), and the
	// dispatcher's wake at a due time is checked by idle-wake, which
	// holds IdleWait beyond any wait here.
	t.Logf("%d tasks over %v, latest run %v after its due time", len(ids), time.Since(start).Round(time.Millisecond), worst.Round(time.Millisecond))
	st := e.stats("default")
	if st.Scheduled != 1 || st.Processed != int64(len(ids)) || st.NextDue.Before(farDue.Add(-time.Minute)) {
		t.Errorf("stats %+v: want 1 scheduled (due in an hour), %d processed", st, len(ids))
	}
	if info := e.lookup(c, far); info.State != engine.StateScheduled {
		t.Errorf("task due in an hour is %s, want still scheduled", info.State)
	}
}

// scenarioCancel: cancelled tasks never run, wherever they were (ready,
// scheduled soon, scheduled far); cancel reports why it cannot.
func scenarioCancel(e *env) {
	t, ctx := e.t, e.ctx
	c := e.client()
	var ready, soon, far []string
	farBase := time.Now().Add(time.Hour)
	for i := 0; i < 8; i++ {
		ready = append(ready, must(t)(c.Enqueue(ctx, "job", nil)))
		soon = append(soon, must(t)(c.Enqueue(ctx, "job", nil, engine.In(400*time.Millisecond))))
		// A chosen id and a second of its own: the task gets a bucket
		// list to itself, not an inline entry, so cancelling it reads the
		// list and drops the bucket.
		far = append(far, must(t)(c.Enqueue(ctx, "job", nil, engine.At(farBase.Add(time.Duration(i)*time.Second)),
			engine.TaskID(fmt.Sprintf("far-%d-%s", i, uuid.NewString())))))
	}
	var cancelled []string
	for _, group := range [][]string{ready, soon, far} {
		cancelled = append(cancelled, group[:4]...)
	}
	for _, id := range cancelled {
		if err := c.Cancel(ctx, id); err != nil {
			t.Fatalf("Cancel %s: %v", id, err)
		}
		if info := e.lookup(c, id); info.State != engine.StateCancelled || info.Finished.IsZero() {
			t.Errorf("cancelled task: state %s, finished %v", info.State, info.Finished)
		}
		if err := c.Cancel(ctx, id); !errors.Is(err, engine.ErrAlreadyDone) {
			t.Errorf("second Cancel: %v, want ErrAlreadyDone", err)
		}
	}
	if err := c.Cancel(ctx, uuid.NewString()); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Cancel of an unknown id: %v, want ErrNotFound", err)
	}
	if err := c.Cancel(ctx, "nonsense"); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Cancel of a malformed id: %v, want ErrNotFound", err)
	}
	if st := e.stats("default"); st.Cancelled != 12 || st.Ready != 4 || st.Scheduled != 8 {
		t.Errorf("after cancelling: %+v; want 12 cancelled, 4 ready, 8 scheduled", st)
	}

	var rec recorder
	release := make(chan struct{})
	started := make(chan string, 1)
	mux := engine.NewMux()
	mux.HandleFunc("job", rec.handler())
	mux.HandleFunc("block", func(ctx context.Context, task *engine.Task) error {
		rec.add(task)
		started <- task.ID
		<-release
		return nil
	})
	_, stop := e.server(e.cfg, mux)
	// The 4 ready and the 4 due soon run; the 4 far ones wait.
	testwait.Until(t, outcomeWait, "the kept tasks that are due", func() bool { return rec.len() >= 8 })
	// Everything due has been handed out once nothing but the 4 far tasks
	// waits and nothing runs: a cancelled task that could run would be
	// ready, scheduled or running then.
	e.expectStats("default", "only the 4 far tasks waiting, nothing ready or running", func(st engine.QueueInfo) bool {
		return st.Scheduled == 4 && st.Ready == 0 && st.Running == 0
	})
	rec.exactlyOnce(t, append(append([]string{}, ready[4:]...), soon[4:]...))

	// Running and done tasks cannot be cancelled.
	blocked := must(t)(c.Enqueue(ctx, "block", nil))
	select {
	case <-started:
	case <-time.After(outcomeWait):
		t.Fatal("the blocking task did not start")
	}
	if err := c.Cancel(ctx, blocked); !errors.Is(err, engine.ErrAlreadyRunning) {
		t.Errorf("Cancel of a running task: %v, want ErrAlreadyRunning", err)
	}
	close(release)
	testwait.Until(t, outcomeWait, "the blocking task to finish", func() bool {
		return e.lookup(c, blocked).State == engine.StateDone
	})
	if err := c.Cancel(ctx, blocked); !errors.Is(err, engine.ErrAlreadyDone) {
		t.Errorf("Cancel of a done task: %v, want ErrAlreadyDone", err)
	}
	// The far ones can still be cancelled while the server runs.
	for _, id := range far[4:] {
		if err := c.Cancel(ctx, id); err != nil {
			t.Errorf("Cancel of a scheduled task: %v", err)
		}
	}
	stop()
	st := e.stats("default")
	if st.Cancelled != 16 || st.Processed != 9 || st.Scheduled != 0 || st.Ready != 0 || st.Running != 0 {
		t.Errorf("final stats %+v: want 16 cancelled, 9 processed, nothing waiting", st)
	}
	for _, id := range cancelled {
		if n := len(rec.of(id)); n != 0 {
			t.Errorf("cancelled task %s ran %d times", id, n)
		}
	}
}

// scenarioCancelRace: cancelling tasks while workers take them is atomic:
// each task either is cancelled and never runs, or runs exactly once and
// Cancel says it is running or done.
func scenarioCancelRace(e *env) {
	t, ctx := e.t, e.ctx
	c := e.client()
	cfg := e.cfg
	cfg.Concurrency = 4
	var rec recorder
	// A run lasts until the next cancel is answered, so that tasks stay
	// ready while the cancels run and the two meet.
	var cancelAnswered testwait.Pulse
	cancelsDone := make(chan struct{})
	h := engine.HandlerFunc(func(ctx context.Context, task *engine.Task) error {
		next := cancelAnswered.Wait()
		rec.add(task)
		select {
		case <-next:
		case <-cancelsDone:
		case <-ctx.Done():
		}
		return nil
	})
	e.worker(cfg, h)
	e.worker(cfg, h)

	const n = 150
	batch := make([]engine.NewTask, n)
	for i := range batch {
		batch[i] = engine.NewTask{Type: "race"}
	}
	ids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil {
		t.Fatal(err)
	}
	results := make([]error, n)
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// From the newest: the workers take the oldest first.
			for i := n - 1 - g; i >= 0; i -= 3 {
				results[i] = c.Cancel(ctx, ids[i])
				cancelAnswered.Beat()
			}
		}()
	}
	wg.Wait()
	close(cancelsDone)
	var cancelled, ran []string
	for i, err := range results {
		switch {
		case err == nil:
			cancelled = append(cancelled, ids[i])
		case errors.Is(err, engine.ErrAlreadyRunning), errors.Is(err, engine.ErrAlreadyDone):
			ran = append(ran, ids[i])
		default:
			t.Errorf("Cancel %s: %v", ids[i], err)
		}
	}
	rec.waitRuns(t, len(ran))
	rec.exactlyOnce(t, ran)
	t.Logf("%d cancelled, %d ran", len(cancelled), len(ran))
	e.expectStats("default", fmt.Sprintf("%d cancelled, %d processed, none ready or running", len(cancelled), len(ran)),
		func(st engine.QueueInfo) bool {
			return st.Cancelled == int64(len(cancelled)) && st.Processed == int64(len(ran)) && st.Ready == 0 && st.Running == 0
		})
}

// scenarioExactlyOnce: four dispatchers and three workers (each on its own
// pool, as separate processes would be) share one namespace; every task
// reaches a ready list once and runs once.
func scenarioExactlyOnce(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Advanced.Resolution = 5 * time.Millisecond
	cfg.Concurrency = 4
	c := e.client()

	var rec recorder
	var ds []enginehook.Dispatcher
	for i := 0; i < 4; i++ {
		d, err := enginehook.NewDispatcher(newPool(t, e.srv, e.kind.census, e.faults), cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.run("dispatcher", d.Run)
		ds = append(ds, d)
	}
	for i := 0; i < 3; i++ {
		w, err := enginehook.NewWorker(newPool(t, e.srv, e.kind.census, e.faults), cfg, rec.handler())
		if err != nil {
			t.Fatal(err)
		}
		e.run("worker", w.Run)
	}

	var ids []string
	scheduled := 0
	for b := 0; b < 6; b++ {
		batch := make([]engine.NewTask, 50)
		for i := range batch {
			batch[i] = engine.NewTask{Type: "once", Options: []engine.Option{engine.In(time.Duration((b*50+i)*3) * time.Millisecond)}}
			if i%5 == 0 {
				batch[i].Options = nil // due now: straight to the ready list
			} else {
				scheduled++
			}
		}
		got, err := idsOf(c.EnqueueBatch(ctx, batch))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	for i := 0; i < 40; i++ { // one by one too, racing the dispatchers
		ids = append(ids, must(t)(c.Enqueue(ctx, "once", nil, engine.In(time.Duration(i+1)*7*time.Millisecond))))
		scheduled++
	}
	rec.waitRuns(t, len(ids))
	rec.exactlyOnce(t, ids)
	var moved, conflicts int64
	for _, d := range ds {
		moved += d.Moved()
		conflicts += d.Conflicts()
	}
	t.Logf("%d tasks (%d scheduled) moved by 4 dispatchers with %d conflicts", len(ids), scheduled, conflicts)
	if moved != int64(scheduled) {
		t.Errorf("dispatchers moved %d tasks in all, want exactly the %d scheduled ones", moved, scheduled)
	}
	e.expectStats("default", fmt.Sprintf("%d processed, nothing left", len(ids)), func(st engine.QueueInfo) bool {
		return st.Processed == int64(len(ids)) && st.Scheduled == 0 && st.Ready == 0 && st.Running == 0
	})
}

// scenarioPriorities: strict priority drains the first queue before the
// next; weighted priority shares fetches by weight and starves none; each
// queue runs first in, first out.
func scenarioPriorities(e *env) {
	t, ctx := e.t, e.ctx
	c := e.client()
	var low, high []string
	for i := 0; i < 10; i++ {
		low = append(low, must(t)(c.Enqueue(ctx, "p", nil, engine.Queue("low"))))
	}
	for i := 0; i < 10; i++ {
		high = append(high, must(t)(c.Enqueue(ctx, "p", nil, engine.Queue("high"))))
	}
	var rec recorder
	cfg := e.cfg
	cfg.Concurrency = 1
	cfg.StrictPriority = true
	cfg.Queues = []engine.QueueConfig{{Name: "high"}, {Name: "low"}}
	_, stop := e.worker(cfg, rec.handler())
	rec.waitRuns(t, 20)
	stop()
	var order []string
	for _, r := range rec.all() {
		order = append(order, r.ID)
	}
	want := append(append([]string{}, high...), low...)
	if strings.Join(order, ",") != strings.Join(want, ",") {
		for i := range order {
			if i < len(want) && order[i] != want[i] {
				t.Errorf("strict priority: run %d was %s (queue %s), want %s: high first, each queue in enqueue order",
					i, order[i], rec.all()[i].Queue, want[i])
				break
			}
		}
	}

	// Weighted: a has weight 3, b weight 1; both stay non-empty over the
	// runs counted, so each fetch tries a first with probability 3/4.
	const each, counted = 80, 60
	for _, q := range []string{"a", "b"} {
		batch := make([]engine.NewTask, each)
		for i := range batch {
			batch[i] = engine.NewTask{Type: "w", Options: []engine.Option{engine.Queue(q)}}
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	var wrec recorder
	cfg.StrictPriority = false
	cfg.Queues = []engine.QueueConfig{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}
	_, stop = e.worker(cfg, wrec.handler())
	wrec.waitRuns(t, 2*each)
	stop()
	na := 0
	for _, r := range wrec.all()[:counted] {
		if r.Queue == "a" {
			na++
		}
	}
	// Mean 45, standard deviation 3.4: 33..57 is more than 3.5 sigma.
	t.Logf("weighted 3:1: %d of the first %d runs from a", na, counted)
	if na < 33 || na > 57 {
		t.Errorf("weighted 3:1: %d of the first %d runs came from queue a, want about %d", na, counted, counted*3/4)
	}
	for _, q := range []string{"a", "b"} {
		if st := e.stats(q); st.Processed != each {
			t.Errorf("queue %s processed %d, want %d", q, st.Processed, each)
		}
	}
}

// scenarioWrongType: a key of the wrong type where a ready list should be
// is set aside (renamed under bad:), and the tasks behind it still run.
func scenarioWrongType(e *env) {
	t, ctx := e.t, e.ctx
	admin := e.admin()
	if _, err := admin.Do("SET", e.key("q:default"), "not a list"); err != nil {
		t.Fatal(err)
	}
	c := e.client()
	id := must(t)(c.Enqueue(ctx, "fine", nil, engine.In(100*time.Millisecond)))
	var rec recorder
	_, stop := e.server(e.cfg, rec.handler())
	rec.waitRuns(t, 1)
	stop()
	rec.exactlyOnce(t, []string{id})
	if v, err := redis.String(admin.Do("GET", e.key("bad:q:default"))); err != nil || v != "not a list" {
		t.Errorf("the wrong-type key was not set aside under bad:: GET = %q, %v", v, err)
	}
	if typ, _ := redis.String(admin.Do("TYPE", e.key("q:default"))); typ != "list" && typ != "none" {
		t.Errorf("ready list is a %s after the dispatcher ran", typ)
	}
}
