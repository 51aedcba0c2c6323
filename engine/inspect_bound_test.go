package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// commandsPerPage pages through a listing and returns the most commands
// one page sent, as the server's census counts them.
func commandsPerPage(t *testing.T, srv *redistest.Server, in *laneInspector, opts ListOptions) (most, pages int) {
	t.Helper()
	ctx := checkCtx(t, time.Minute)
	total := func() int {
		n := 0
		for _, c := range srv.Census.Commands() {
			n += srv.Census.Count(c)
		}
		return n
	}
	for {
		before := total()
		p, err := in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		most = max(most, total()-before)
		if p.Next == "" {
			return most, pages
		}
		opts.Cursor = p.Next
	}
}

// A page costs the same number of commands whatever the number of tasks:
// listings of a few hundred and of several thousand tasks, in every
// listable state, send at most as many commands per page.
func TestInspectBoundedWorkPerPage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	fill := func(e *env, n int) {
		c := e.client(t)
		ctx := checkCtx(t, time.Minute)
		batch := make([]NewTask, 0, 2*n)
		for i := 0; i < n; i++ {
			batch = append(batch,
				NewTask{Type: "t", Payload: []byte(fmt.Sprintf("ready %d", i))},
				NewTask{Type: "t", Payload: []byte(fmt.Sprintf("sched %d", i)), Options: []Option{In(time.Hour + time.Duration(i)*10*time.Millisecond)}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// Dead letters: bury n tasks whose type has no handler.
		cfg := e.cfg
		cfg.Queues = []QueueConfig{{Name: "doomed", Weight: 1}}
		cfg.UnknownType = "dead"
		cfg.Advanced.UnknownTypeGrace = -1 // no worker serves "nobody": dead at once
		cfg.Concurrency = 20
		dead := make([]NewTask, n)
		for i := range dead {
			dead[i] = NewTask{Type: "nobody", Payload: []byte(fmt.Sprintf("dead %d", i)), Options: []Option{Queue("doomed")}}
		}
		if _, err := c.EnqueueBatch(ctx, dead); err != nil {
			t.Fatal(err)
		}
		w, err := newWorker(e.pool, cfg, NewMux())
		if err != nil {
			t.Fatal(err)
		}
		stop := runBackground(t, w.Run)
		in := c.inspector()
		// Each read has a deadline of its own: under load the 3000 runs
		// take longer than fill's minute, and a read on its expired ctx
		// could never see them done.
		var last *QueueInfo
		var lastErr error
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("queue doomed as last read: %+v (last read error: %v)", last, lastErr)
			}
		})
		waitFor(t, outcomeWait, "the dead letters", func() bool {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			q, err := in.Queue(rctx, "doomed")
			if lastErr = err; err == nil {
				last = q
			}
			return err == nil && q.Dead == int64(n)
		})
		stop()
	}
	listings := []Filter{
		{Queue: "default", State: StateReady},
		{Queue: "default", State: StateScheduled},
		{Queue: "default", State: StateReady, Search: "ready 7"},
		{Queue: "default", State: StateScheduled, Search: "sched 7"},
		{Queue: "doomed", State: StateDead},
		{State: StateDead, Search: "dead 7"},
	}
	var small, large []int
	for _, n := range []int{300, 3000} {
		e := newEnv(t, srv)
		fill(e, n)
		in, _ := newLaneInspector(srv.Pool(t), e.cfg)
		for _, f := range listings {
			most, pages := commandsPerPage(t, srv, in, ListOptions{Filter: f, Limit: 50})
			t.Logf("%d tasks, %s/%s search %q: %d pages, at most %d commands a page", n, f.Queue, f.State, f.Search, pages, most)
			if n == 300 {
				small = append(small, most)
			} else {
				large = append(large, most)
			}
		}
	}
	for i, f := range listings {
		if large[i] > small[i] {
			t.Errorf("%s/%s search %q: %d commands a page with 3000 tasks, %d with 300", f.Queue, f.State, f.Search, large[i], small[i])
		}
		if large[i] > maxVisits+12 {
			t.Errorf("%s/%s: %d commands a page, over the bound of %d", f.Queue, f.State, large[i], maxVisits+12)
		}
	}
	redistest.RequireNoViolations(t, srv)
}
