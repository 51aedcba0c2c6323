package engine

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestSmokeEndToEnd(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		var mu sync.Mutex
		got := map[string]time.Time{}
		mux := NewMux()
		mux.HandleFunc("hello", func(ctx context.Context, task *Task) error {
			mu.Lock()
			got[task.ID] = time.Now()
			mu.Unlock()
			return nil
		})
		srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		stop := runBackground(t, srv.Run)
		now := time.Now()
		due := map[string]time.Time{}
		for i := 0; i < 20; i++ {
			d := time.Duration(i*20) * time.Millisecond
			id, err := idOf(c.Enqueue(ctx, "hello", []byte("x"), In(d)))
			if err != nil {
				t.Fatal(err)
			}
			due[id] = now.Add(d)
		}
		waitFor(t, outcomeWait, "all tasks to run", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == len(due)
		})
		stop()
		for id, at := range got {
			info, err := c.Lookup(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			// Never early: against the due time as stored in the record
			// (the producer's clock when it enqueued, plus the delay).
			if at.Before(info.Due) || info.Due.Before(due[id].Truncate(time.Millisecond)) {
				t.Errorf("task %s ran at %v, due %v as stored (asked for no earlier than %v)", id, at, info.Due, due[id])
			}
			if info.State != StateDone {
				t.Errorf("task %s: state %s, want done", id, info.State)
			}
		}
	})
}
