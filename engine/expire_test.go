package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/clocktest"
)

// A task not started by its expiry never starts: waiting in a paused
// queue past it, it is buried as expired when the queue resumes, counted
// in the queue's expired figure, while a task without one runs.
func TestExpireIn(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		clock := clocktest.NewSettable(time.Now())
		e.cfg.Advanced.Clock = clock
		e.cfg.Queues = []QueueConfig{{Name: "exp"}}
		c := e.client(t)
		in := c.inspector()
		if err := in.PauseQueue(ctx, "exp"); err != nil {
			t.Fatal(err)
		}
		stale, err := idOf(c.Enqueue(ctx, "job", nil, Queue("exp"), ExpireIn(time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := idOf(c.Enqueue(ctx, "job", nil, Queue("exp")))
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := c.Lookup(ctx, stale); !info.Expires.Equal(time.UnixMilli(clock.Now().Add(time.Minute).UnixMilli())) {
			t.Fatalf("Lookup: expires %v, want a minute from enqueue", info.Expires)
		}
		clock.Set(clock.Now().Add(2 * time.Minute))
		var mu sync.Mutex
		ran := map[string]bool{}
		mux := NewMux()
		mux.HandleFunc("job", func(_ context.Context, t *Task) error {
			mu.Lock()
			ran[t.ID] = true
			mu.Unlock()
			return nil
		})
		srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		if err := in.ResumeQueue(ctx, "exp"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "the fresh task done", func() bool { return e.state(t, fresh) == StateDone })
		waitFor(t, outcomeWait, "the stale task dead", func() bool { return e.state(t, stale) == StateDead })
		mu.Lock()
		defer mu.Unlock()
		if ran[stale] {
			t.Fatal("the task ran after its expiry")
		}
		info, _ := c.Lookup(ctx, stale)
		if !strings.HasPrefix(info.LastError, "expired: not started by ") || info.Run != 0 {
			t.Fatalf("expired task: reason %q, runs %d", info.LastError, info.Run)
		}
		if st, _ := c.Stats(ctx); len(st) != 1 || st[0].Expired != 1 || st[0].Dead != 1 {
			t.Fatalf("stats %+v, want 1 expired and dead", st)
		}
	})
}

// ExpireIn refuses what could never start, and a workflow's tasks.
func TestExpireInRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	ctx := context.Background()
	c := e.client(t)
	for name, opts := range map[string][]Option{
		"zero":            {ExpireIn(0)},
		"before its due":  {In(time.Hour), ExpireIn(10 * time.Minute)},
		"negative expiry": {ExpireIn(-time.Second)},
	} {
		if _, err := c.Enqueue(ctx, "job", nil, opts...); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := c.EnqueueChain(ctx, "", Step{Type: "a", Options: []Option{ExpireIn(time.Minute)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a chain step with ExpireIn: %v, want ErrInvalid", err)
	}
}
