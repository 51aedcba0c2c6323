package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// Two worker processes of 10 slots each, on a queue that lets one task
// of a key run at a time: at no instant do two tasks of one key run, and
// while each key has a backlog, one of every key does run.
func TestKeyLimitAcrossServers(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Concurrency = 10
		cfg.Queues = []QueueConfig{{Name: "mail", KeyMaxRunning: 1}}
		var mu sync.Mutex
		inside := map[string]int{}
		over := ""
		release := make(chan struct{}, 100)
		started := make(chan string, 100)
		mux := NewMux()
		mux.HandleFunc("hold", func(ctx context.Context, task *Task) error {
			mu.Lock()
			inside[task.Key]++
			if inside[task.Key] > 1 {
				over = task.Key
			}
			mu.Unlock()
			started <- task.Key
			select {
			case <-release:
			case <-ctx.Done():
			}
			mu.Lock()
			inside[task.Key]--
			mu.Unlock()
			return nil
		})
		e.cfg = cfg
		e.runServer(t, mux)
		e.runServer(t, mux)
		c := e.client(t)
		var batch []NewTask
		for _, k := range []string{"a", "b", "c"} {
			for range 4 {
				batch = append(batch, NewTask{Type: "hold", Options: []Option{Queue("mail"), Key(k)}})
			}
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for len(seen) < 3 {
			select {
			case k := <-started:
				seen[k] = true
			case <-time.After(outcomeWait):
				t.Fatalf("keys started: %v; want one task of each of a, b, c", seen)
			}
		}
		// Let every task end, each as soon as it starts: a key's next
		// task starts when its previous one ended.
		for range 12 {
			release <- struct{}{}
		}
		for n := 3; n < 12; n++ {
			select {
			case <-started:
			case <-time.After(outcomeWait):
				t.Fatalf("%d of 12 tasks started", n)
			}
		}
		waitFor(t, outcomeWait, "every task to end", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return inside["a"]+inside["b"]+inside["c"] == 0
		})
		mu.Lock()
		defer mu.Unlock()
		if over != "" {
			t.Fatalf("two tasks of key %s ran at once", over)
		}
	})
}

// A key's single task is not held up by another key's backlog: it starts
// within a few tasks of the flood, on a worker of one slot.
func TestKeyFairness(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	cfg := e.cfg
	cfg.Concurrency = 1
	cfg.Queues = []QueueConfig{{Name: "mail"}}
	c := e.client(t)
	var batch []NewTask
	for range 200 {
		batch = append(batch, NewTask{Type: "t", Options: []Option{Queue("mail"), Key("flood")}})
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, "t", nil, Queue("mail"), Key("small")); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 300)
	mux := NewMux()
	mux.HandleFunc("t", func(_ context.Context, task *Task) error { order <- task.Key; return nil })
	e.cfg = cfg
	e.runServer(t, mux)
	for i := 0; ; i++ {
		select {
		case k := <-order:
			if k == "small" {
				// The worker claims a batch of one key at a time: at
				// most one batch of the flood goes first.
				if i > cfg.withDefaults().Advanced.ClaimBatch {
					t.Fatalf("the small key's task started %d-th, behind the flood", i+1)
				}
				return
			}
		case <-time.After(outcomeWait):
			t.Fatalf("the small key's task did not start; %d of the flood did", i)
		}
	}
}

// A queue rate is a sliding window: of a burst, N start in the first
// window, the rest wait their turn, and no window of the period holds
// more than N starts.
func TestQueueRateWindow(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Concurrency = 4
		// Real time is what a rate limit is about: the window is short so
		// the test is too.
		cfg.Queues = []QueueConfig{{Name: "mail", Rate: "3/300ms"}}
		var mu sync.Mutex
		var starts []time.Time
		// A start is the time its claim recorded (the time the limit
		// counts), not when the handler got the CPU: on a loaded machine
		// that comes later by a varying delay.
		cfg.Observer = ObserverFunc(func(ev Event) {
			if ev.Kind == EventStarted {
				mu.Lock()
				starts = append(starts, ev.Time)
				mu.Unlock()
			}
		})
		done := make(chan struct{}, 20)
		mux := NewMux()
		mux.HandleFunc("t", func(_ context.Context, task *Task) error {
			done <- struct{}{}
			return nil
		})
		e.cfg = cfg
		e.runServer(t, mux)
		c := e.client(t)
		var batch []NewTask
		for range 9 {
			batch = append(batch, NewTask{Type: "t", Options: []Option{Queue("mail")}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		for i := range 9 {
			select {
			case <-done:
			case <-time.After(outcomeWait):
				t.Fatalf("%d of 9 started", i)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(starts, time.Time.Compare)
		// The recorded starts are whole milliseconds, taken by the
		// claimer's clock: allow some slack in the window.
		const slack = 40 * time.Millisecond
		for i := 3; i < len(starts); i++ {
			if d := starts[i].Sub(starts[i-3]); d < 300*time.Millisecond-slack {
				t.Fatalf("starts %d and %d are %v apart: 4 in a window of 300ms", i-3, i, d)
			}
		}
		if d := starts[8].Sub(starts[0]); d > 5*time.Second {
			t.Fatalf("9 tasks at 3/300ms took %v", d)
		}
	})
}

// Bad limits are refused with ErrInvalid, naming the field.
func TestQueueLimitsInvalid(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	for _, qc := range []QueueConfig{
		{Name: "q", Rate: "ten/1s"}, {Name: "q", KeyRate: "1/0s"}, {Name: "q", KeyMaxRunning: -1},
	} {
		if err := c.SetQueueLimits(context.Background(), qc); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", qc, err)
		}
		cfg := e.cfg
		cfg.Queues = []QueueConfig{qc}
		cfg.Queues[0].Weight = 1
		if _, err := newLaneServer(e.pool, cfg, NewMux(), AllRoles); !errors.Is(err, ErrInvalid) {
			t.Errorf("server with %+v: %v, want ErrInvalid", qc, err)
		}
	}
	if _, err := c.Enqueue(context.Background(), "t", nil, Key("a:b")); !errors.Is(err, ErrInvalid) {
		t.Errorf("Key(a:b): %v, want ErrInvalid", err)
	}
}

// A Server that starts while Redis refuses writes (full) does not give
// up: it writes its configured limits as soon as Redis takes them, and
// runs.
func TestServerWritesLimitsOnceRedisTakesThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, redistest.Start(t, redistest.Private()))
	admin := e.admin(t)
	defer admin.Close()
	if _, err := admin.Do("CONFIG", "SET", "maxmemory", 1); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	cfg := e.cfg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Queues = []QueueConfig{{Name: "mail", MaxRunning: 3}}
	srv, err := newLaneServer(e.pool, cfg, NewMux(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "the refused write of the limits", func() bool {
		return strings.Contains(logs.String(), "write the queue limits failed")
	})
	if _, err := admin.Do("CONFIG", "SET", "maxmemory", 0); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	waitFor(t, outcomeWait, "the limits written", func() bool {
		qs, err := c.Stats(context.Background())
		return err == nil && len(qs) == 1 && qs[0].MaxRunning == 3
	})
}
