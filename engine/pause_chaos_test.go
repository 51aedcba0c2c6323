package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Pause and resume while workers die at random steps (after a pop, after
// a claim, before or after a finish) and reapers return their tasks: no
// handler starts in a paused window (from a second after PauseQueue
// returned until ResumeQueue is called), and in the end every task is
// done, none dead.
func TestPauseChaos(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	cfg := e.cfg
	cfg.Concurrency = 2
	cfg.Queues = []QueueConfig{{Name: "q"}}
	var mu sync.Mutex
	var starts []time.Time
	h := HandlerFunc(func(ctx context.Context, task *Task) error {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		// real time: runs of 5 ms, so that some are running at each pause.
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	bg, err := newLaneServer(e.pool, cfg, nil, RoleDispatcher|RoleReaper)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, bg.Run)
	healthy, err := newWorker(e.pool, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, healthy.Run)
	c := e.client(t)
	stages := []string{"after-pop", "after-claim", "before-finish", "after-finish"}
	var stops []func()
	defer func() {
		// A dead worker's way out retries its failing calls for seconds:
		// stop them all at once.
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
	}()
	dying := func() {
		w, err := newWorker(e.pool, cfg, h)
		if err != nil {
			t.Fatal(err)
		}
		w.setStore(&dyingStore{store: w.store, stage: stages[rand.IntN(len(stages))]})
		w.cfg.ShutdownTimeout = -1
		stops = append(stops, runBackground(t, func(ctx context.Context) error { _ = w.Run(ctx); return nil }))
	}
	type window struct{ from, to time.Time }
	var windows []window
	var ids []string
	for cycle := 0; cycle < 3; cycle++ {
		dying()
		var batch []NewTask
		for i := 0; i < 30; i++ {
			opts := []Option{Queue("q")}
			if i%3 == 0 {
				opts = append(opts, In(time.Duration(rand.IntN(300))*time.Millisecond))
			}
			batch = append(batch, NewTask{Type: "t", Payload: []byte(fmt.Sprint(cycle, i)), Options: opts})
		}
		got, err := idsOf(c.EnqueueBatch(ctx, batch))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
		if err := c.PauseQueue(ctx, "q"); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		dying() // starts, and may die, while the queue is paused
		// Paused, the dispatcher still moves the delayed tasks, and the
		// reaper returns what dead workers held: wait for both, and for
		// a second past the pause (real time: the pause's documented
		// grace).
		waitFor(t, outcomeWait, "due tasks moved and dead workers' tasks returned", func() bool {
			st := queueStats(t, c, "q")
			return st.Scheduled == 0 && st.Running == 0 && time.Since(paused) > 1500*time.Millisecond
		})
		resumed := time.Now()
		t.Logf("cycle %d: paused for %v", cycle, resumed.Sub(paused).Round(time.Millisecond))
		windows = append(windows, window{paused.Add(time.Second), resumed})
		if err := c.ResumeQueue(ctx, "q"); err != nil {
			t.Fatal(err)
		}
	}
	end := time.Now()
	for _, id := range ids {
		waitFor(t, outcomeWait, "every task done", func() bool { return e.state(t, id) == StateDone })
	}
	t.Logf("all done %v after the last resume", time.Since(end).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	for _, s := range starts {
		for _, w := range windows {
			if s.After(w.from) && s.Before(w.to) {
				t.Errorf("a handler started %v into a paused window of %v", s.Sub(w.from.Add(-time.Second)), w.to.Sub(w.from.Add(-time.Second)))
			}
		}
	}
	if st := queueStats(t, c, "q"); st.Dead != 0 {
		t.Errorf("stats %+v: want nothing dead", st)
	}
	t.Logf("%d tasks, %d handler starts, %d paused windows", len(ids), len(starts), len(windows))
}
