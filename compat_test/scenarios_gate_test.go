package compat_test

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/testwait"
)

// scenarioPause: a paused queue's tasks do not start while the other
// queue's do; stats and Paused say so; the pause outlives the worker; a
// resume runs them.
func scenarioPause(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Queues = []engine.QueueConfig{{Name: "held"}, {Name: "free"}}
	c := e.client()
	var rec recorder
	mux := engine.NewMux()
	mux.HandleFunc("t", rec.handler())
	in := e.inspector()
	if err := in.PauseQueue(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	held := must(t)(c.Enqueue(ctx, "t", nil, engine.Queue("held")))
	_, stop := e.worker(cfg, mux)
	free := must(t)(c.Enqueue(ctx, "t", nil, engine.Queue("free")))
	testwait.Until(t, outcomeWait, "the free queue's task", func() bool { return len(rec.of(free)) == 1 })
	stop()
	if n := len(rec.of(held)); n != 0 {
		t.Fatalf("a task of the paused queue ran %d times", n)
	}
	if st := e.stats("held"); !st.Paused || st.Ready != 1 {
		t.Errorf("stats of the paused queue %+v, want paused with 1 ready", st)
	}
	// A new worker: the pause holds (it is in Redis), until the resume.
	e.worker(cfg, mux)
	free2 := must(t)(c.Enqueue(ctx, "t", nil, engine.Queue("free")))
	testwait.Until(t, outcomeWait, "the second free task", func() bool { return len(rec.of(free2)) == 1 })
	if n := len(rec.of(held)); n != 0 {
		t.Fatalf("a task of the paused queue ran %d times after a restart", n)
	}
	if err := in.ResumeQueue(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, outcomeWait, "the resumed task", func() bool { return len(rec.of(held)) == 1 })
	if st := e.stats("held"); st.Paused {
		t.Errorf("stats after the resume %+v, want not paused", st)
	}
}

// scenarioHandlerSets: two workers with disjoint handler sets share a
// queue: each task runs once, on the worker that serves it, with no
// attempt spent; a type nobody serves is listed as unserved and meets the
// unknown-type policy only after the grace.
func scenarioHandlerSets(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.UnknownType = "dead"
	cfg.Advanced.UnknownTypeGrace = time.Second
	cfg.Concurrency = 2
	c := e.client()
	var mu sync.Mutex
	ranOn := map[string][]string{}
	for name, typ := range map[string]string{"A": "a", "B": "b"} {
		mux := engine.NewMux()
		mux.HandleFunc(typ, func(_ context.Context, task *engine.Task) error {
			mu.Lock()
			ranOn[task.ID] = append(ranOn[task.ID], name)
			mu.Unlock()
			return nil
		})
		e.worker(cfg, mux)
	}
	var batch []engine.NewTask
	for i := 0; i < 20; i++ {
		batch = append(batch, engine.NewTask{Type: []string{"a", "b"}[i%2], Options: []engine.Option{engine.MaxAttempts(3)}})
	}
	ids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil {
		t.Fatal(err)
	}
	nobody := must(t)(c.Enqueue(ctx, "nobody", nil))
	enqueued := time.Now()
	for _, id := range ids {
		testwait.Until(t, outcomeWait, "every task done", func() bool { return e.lookup(c, id).State == engine.StateDone })
	}
	mu.Lock()
	for i, id := range ids {
		want := []string{"A", "B"}[i%2]
		if got := ranOn[id]; len(got) != 1 || got[0] != want {
			t.Errorf("task %s ran on %v, want once on %s", id, got, want)
		}
	}
	mu.Unlock()
	testwait.Until(t, outcomeWait, "the unserved type listed", func() bool {
		un, err := e.inspector().Unserved(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(un) == 1 && un[0].Type == "nobody"
	})
	testwait.Until(t, outcomeWait, "the unserved task dead", func() bool { return e.lookup(c, nobody).State == engine.StateDead })
	if info := e.lookup(c, nobody); info.Finished.Sub(enqueued) < cfg.Advanced.UnknownTypeGrace {
		t.Errorf("the unserved task died %v after its enqueue, within the grace of %v", info.Finished.Sub(enqueued), cfg.Advanced.UnknownTypeGrace)
	}
	if st := e.stats("default"); st.Failed != 1 || st.Dead != 1 {
		t.Errorf("stats %+v: want the one unserved task failed and dead, nothing else", st)
	}
}

// scenarioQueueLimit: a queue limited to one running task across two
// Servers runs its tasks one at a time (each claim takes the slot, each
// result gives it back), the figures show the limit, and it is removed.
func scenarioQueueLimit(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Queues = []engine.QueueConfig{{Name: "lim", MaxRunning: 1}}
	cfg.Concurrency = 4
	c := e.client()
	var inside, most atomic.Int64
	var done atomic.Int64
	left := atomic.Int64{}
	left.Store(6)
	// A run holds its slot until another worker tried to take a task and
	// gave it back for the limit (or another run started: the overlap
	// the test looks for), unless no task is left to take.
	var tried testwait.Pulse
	e.heldClaims(&tried)
	mux := engine.NewMux()
	mux.HandleFunc("t", func(hctx context.Context, _ *engine.Task) error {
		next := tried.Wait()
		tried.Beat()
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if left.Add(-1) > 0 {
			select {
			case <-next:
			case <-hctx.Done():
			}
		}
		inside.Add(-1)
		done.Add(1)
		return nil
	})
	for range 6 {
		must(t)(c.Enqueue(ctx, "t", nil, engine.Queue("lim")))
	}
	e.server(cfg, mux)
	e.server(cfg, mux)
	testwait.Until(t, outcomeWait, "the limited queue's tasks", func() bool { return done.Load() == 6 })
	if m := most.Load(); m != 1 {
		t.Fatalf("%d runs of a queue limited to 1 at once", m)
	}
	e.expectStats("lim", "limit 1, no slot in use", func(st engine.QueueInfo) bool { return st.MaxRunning == 1 && st.SlotsInUse == 0 })
	in := e.inspector()
	if err := in.SetQueueLimits(ctx, engine.QueueConfig{Name: "lim"}); err != nil {
		t.Fatal(err)
	}
	e.expectStats("lim", "no limit", func(st engine.QueueInfo) bool { return st.MaxRunning == 0 && st.SlotsInUse == 0 })
}

// scenarioKeys: keyed tasks of a queue with per-key and rate limits
// across two Servers: no two tasks of one key run at once, each key's
// starts keep its window, a key's single task is not held up behind
// another key's backlog, delayed keyed tasks come into turn when moved,
// and the figures show the keys waiting.
func scenarioKeys(e *env) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	cfg.Queues = []engine.QueueConfig{{Name: "keyed", KeyMaxRunning: 1, Rate: "100/1s", KeyRate: "50/1s"}}
	cfg.Concurrency = 4
	c := e.client()
	var mu sync.Mutex
	inside := map[string]int{}
	over := ""
	var done, left atomic.Int64
	// A run holds its key until a worker tried to take a task and gave it
	// back for a limit (or another run started: an overlap the test looks
	// for), unless no task is left to take.
	var tried testwait.Pulse
	e.heldClaims(&tried)
	mux := engine.NewMux()
	mux.HandleFunc("t", func(hctx context.Context, task *engine.Task) error {
		next := tried.Wait()
		tried.Beat()
		mu.Lock()
		if inside[task.Key]++; inside[task.Key] > 1 {
			over = task.Key
		}
		mu.Unlock()
		if left.Add(-1) > 0 {
			select {
			case <-next:
			case <-hctx.Done():
			}
		}
		mu.Lock()
		inside[task.Key]--
		mu.Unlock()
		done.Add(1)
		return nil
	})
	var batch []engine.NewTask
	for i := range 8 {
		batch = append(batch, engine.NewTask{Type: "t", Options: []engine.Option{engine.Queue("keyed"), engine.Key("big")}})
		if i%4 == 0 {
			batch = append(batch, engine.NewTask{Type: "t", Options: []engine.Option{engine.Queue("keyed"), engine.Key("small"), engine.In(200 * time.Millisecond)}})
		}
	}
	left.Store(int64(len(batch)))
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	e.expectStats("keyed", "one key waiting before any worker", func(st engine.QueueInfo) bool { return st.KeysWaiting == 1 })
	e.server(cfg, mux)
	e.server(cfg, mux)
	testwait.Until(t, outcomeWait, "the keyed tasks", func() bool { return done.Load() == int64(len(batch)) })
	mu.Lock()
	defer mu.Unlock()
	if over != "" {
		t.Fatalf("two tasks of key %s ran at once", over)
	}
	e.expectStats("keyed", "no key waiting, the limits shown", func(st engine.QueueInfo) bool {
		return st.KeysWaiting == 0 && st.Rate == "100/1s" && st.KeyMaxRunning == 1 && st.KeyRate == "50/1s"
	})
}
