package engine

import (
	"context"

	"sync"
	"testing"
	"time"
)

// Two workers with disjoint handler sets on one queue, 3 attempts: every
// task runs on the worker that serves its type, none is dead, no attempt
// is consumed by the other worker; each advertises its types.
func TestDisjointHandlerSets(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Concurrency = 2
		cfg.DefaultMaxAttempts = 3
		var mu sync.Mutex
		ranOn := map[string][]string{} // task id → workers that ran it
		muxes := map[string]*Mux{"A": NewMux(), "B": NewMux()}
		for name, typ := range map[string]string{"A": "a", "B": "b"} {
			muxes[name].HandleFunc(typ, func(ctx context.Context, t *Task) error {
				mu.Lock()
				ranOn[t.ID] = append(ranOn[t.ID], name)
				mu.Unlock()
				return nil
			})
		}
		var workers []*worker
		for _, name := range []string{"A", "B"} {
			w, err := newWorker(e.pool, cfg, muxes[name])
			if err != nil {
				t.Fatal(err)
			}
			workers = append(workers, w)
			runBackground(t, w.Run)
		}
		c := e.client(t)
		var batch []NewTask
		for i := 0; i < 100; i++ {
			batch = append(batch, NewTask{Type: []string{"a", "b"}[i%2]})
		}
		infos, err := c.EnqueueBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			waitFor(t, outcomeWait, "every task done", func() bool { return e.state(t, in.ID) == StateDone })
		}
		mu.Lock()
		defer mu.Unlock()
		for _, in := range infos {
			want := map[string]string{"a": "A", "b": "B"}[in.Type]
			if got := ranOn[in.ID]; len(got) != 1 || got[0] != want {
				t.Errorf("task %s of type %s ran on %v, want once on %s", in.ID, in.Type, got, want)
			}
		}
		st := queueStats(t, c, cfg.withDefaults().DefaultQueue)
		if st.Failed != 0 || st.Dead != 0 || st.Processed != int64(len(infos)) {
			t.Errorf("stats %+v: want %d processed, nothing failed or dead", st, len(infos))
		}
		for _, w := range workers {
			if w.Failed() != 0 {
				t.Errorf("worker %s counted %d failures", w.ID(), w.Failed())
			}
		}
		if un, err := c.Unserved(ctx); err != nil || len(un) != 0 {
			t.Errorf("Unserved() = %v, %v; want none (both types are served)", un, err)
		}
	})
}

// A type nobody serves: its task is given back, without an attempt, for
// UnknownTypeGrace; Unserved lists it meanwhile; after the grace the
// unknown-type policy applies (retry: 3 attempts, then dead).
func TestUnservedTypeGrace(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Advanced.UnknownTypeGrace = 1500 * time.Millisecond
		mux := NewMux()
		mux.HandleFunc("served", func(context.Context, *Task) error { return nil })
		srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		c := e.client(t)
		id, err := idOf(c.Enqueue(ctx, "nobody", nil, MaxAttempts(3)))
		if err != nil {
			t.Fatal(err)
		}
		var since time.Time
		waitFor(t, outcomeWait, "the type listed as unserved", func() bool {
			un, err := c.Unserved(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range un {
				if u.Type == "nobody" {
					since = u.Since
					return true
				}
			}
			return false
		})
		if info, err := c.Lookup(ctx, id); err != nil || info.Attempts != 0 {
			t.Fatalf("during the grace: %+v, %v; want no attempt consumed", info, err)
		}
		waitFor(t, outcomeWait, "the task dead", func() bool { return e.state(t, id) == StateDead })
		info, err := c.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if info.Attempts != 3 || info.LastError == "" {
			t.Fatalf("dead after %d attempts (%q), want 3 with the reason", info.Attempts, info.LastError)
		}
		if died := info.Finished; died.Sub(since) < cfg.Advanced.UnknownTypeGrace {
			t.Fatalf("dead %v after it was first seen unserved; the grace is %v", died.Sub(since), cfg.Advanced.UnknownTypeGrace)
		}

	})
}
