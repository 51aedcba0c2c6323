package engine

import (
	"context"
	"testing"
	"time"
)

func commandTotal(e *env) int {
	n := 0
	for _, c := range e.srv.Census.Commands() {
		n += e.srv.Census.Count(c)
	}
	return n
}

// An idle server (dispatcher, reaper, worker with 16 slots on three
// queues) sends a bounded number of commands per IdleWait and heartbeat:
// nothing polls. With the one-second settings used here the budget is
// about 5 per IdleWait (the waiter's BLPOP and one fetch round of 3
// queues; the dispatcher's BLPOP and index read), 4 per heartbeat and 4
// per reap; with the defaults (20 s, 10 s, 30 s) that is under one command
// a second. docs/benchmarks.md has the figures measured with defaults.
func TestIdleCost(t *testing.T) {
	e := privateEnv(t)
	e.cfg.IdleWait = time.Second
	e.cfg.HeartbeatInterval = time.Second
	e.cfg.HeartbeatTTL = 3 * time.Second
	e.cfg.ReapInterval = time.Second
	e.cfg.Concurrency = 16
	e.cfg.Queues = []QueueConfig{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	srv, err := NewServer(e.pool, e.cfg, NewMux(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	stopIdle := runBackground(t, srv.Run)
	time.Sleep(1500 * time.Millisecond) // start-up
	before := commandTotal(e)
	const window = 5 * time.Second
	time.Sleep(window)
	perSec := float64(commandTotal(e)-before) / window.Seconds()
	t.Logf("idle: %.1f commands/s with 1 s IdleWait, heartbeat and reap interval", perSec)
	// About 5 + 4 + 4 a second (measured: 14.2); the budget leaves room
	// for timers that fire together in the window. A poll would send
	// thousands.
	if perSec > 20 {
		t.Fatalf("idle server sent %.1f commands/s; budget 20", perSec)
	}
	stopIdle()

	// And an idle worker starts a new task at once: woken by the enqueue's
	// token, not by its idle timeout. IdleWait is 10 s here and the task
	// must start within wakeBound (a few round trips, with room for a
	// loaded machine): a worker that polled, or slept its IdleWait, fails.
	const wakeBound = time.Second
	e.cfg.IdleWait = 10 * time.Second
	c := e.client(t)
	ran := make(chan time.Time, 1)
	mux := NewMux()
	mux.HandleFunc("t", func(ctx context.Context, task *Task) error { ran <- time.Now(); return nil })
	w, err := NewWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	blpops := e.srv.Census.Count("BLPOP")
	runBackground(t, w.Run)
	// The worker is idle once its waiter has sent its BLPOP and the slots
	// found nothing (their fetch round comes first).
	waitFor(t, 10*time.Second, "the idle worker's BLPOP", func() bool { return e.srv.Census.Count("BLPOP") > blpops })
	t0 := time.Now()
	if _, err := c.Enqueue(context.Background(), "t", nil, Queue("c")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ran:
		d := at.Sub(t0)
		t.Logf("idle worker started a new task after %v (IdleWait %v)", d, e.cfg.IdleWait)
		if d > wakeBound {
			t.Fatalf("an idle worker started a new task after %v; the wake-up path should take under %v (IdleWait %v)", d, wakeBound, e.cfg.IdleWait)
		}
	case <-time.After(e.cfg.IdleWait + 2*time.Second):
		t.Fatalf("an idle worker did not start a new task within IdleWait %v", e.cfg.IdleWait)
	}
}
