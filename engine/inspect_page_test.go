package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// pageWhileMoving pages through a listing while tasks leave it, and
// checks that no id comes twice and that every id still in the listed
// structure at the end (so in it the whole time) was listed.
func pageWhileMoving(t *testing.T, in *Inspector, opts ListOptions, remaining func() []string, moved func() bool) {
	t.Helper()
	ctx := checkCtx(t, time.Minute)
	seen := map[string]bool{}
	pages := 0
	for {
		p, err := in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, v := range p.Tasks {
			if seen[v.ID] {
				t.Fatalf("page %d: %s listed twice", pages, v.ID)
			}
			seen[v.ID] = true
		}
		if p.Next == "" {
			break
		}
		opts.Cursor = p.Next
		time.Sleep(time.Millisecond) // pace the pages so that tasks move between them
	}
	if !moved() {
		t.Fatalf("nothing moved while %d pages were read: the test proves nothing", pages)
	}
	rest := remaining()
	for _, id := range rest {
		if !seen[id] {
			t.Fatalf("%s stayed %s throughout but was not listed (%d listed in %d pages, %d remain)", id, opts.State, len(seen), pages, len(rest))
		}
	}
	t.Logf("%s: %d listed in %d pages while tasks moved; %d still there at the end", opts.State, len(seen), pages, len(rest))
}

// Paging the ready list while workers consume it.
func TestInspectPagingReadyWhileConsumed(t *testing.T) {
	e := realEnv(t)
	e.cfg.Concurrency = 4
	c := e.client(t)
	in := c.Inspector()
	ctx := checkCtx(t, time.Minute)
	const n = 3000
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = NewTask{Type: "t", Payload: []byte(fmt.Sprint(i))}
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	w, err := NewWorker(e.pool, e.cfg, HandlerFunc(func(context.Context, *Task) error {
		ran.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, w.Run)
	waitFor(t, 10*time.Second, "the worker to start", func() bool { return ran.Load() > 0 })
	admin := e.admin(t)
	pageWhileMoving(t, in, ListOptions{Filter: Filter{Queue: "default", State: StateReady}, Limit: 25},
		func() []string {
			stop()
			ids, err := redis.Strings(admin.Do("LRANGE", e.key("q:default"), 0, -1))
			if err != nil {
				t.Fatal(err)
			}
			return ids
		}, func() bool { return ran.Load() > 100 })
}

// Paging the scheduled tasks while the dispatcher moves their buckets.
func TestInspectPagingScheduledWhileDispatched(t *testing.T) {
	e := realEnv(t)
	e.cfg.Resolution = time.Millisecond
	c := e.client(t)
	in := c.Inspector()
	ctx := checkCtx(t, time.Minute)
	const n = 3000
	start := time.Now().Add(300 * time.Millisecond)
	batch := make([]NewTask, n)
	for i := range batch {
		// Three tasks per bucket, buckets a millisecond apart.
		batch[i] = NewTask{Type: "t", Options: []Option{At(start.Add(time.Duration(i/3) * time.Millisecond))}}
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	d, err := NewDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, d.Run)
	admin := e.admin(t)
	waitFor(t, 10*time.Second, "the dispatcher to start moving", func() bool {
		n, _ := redis.Int(admin.Do("LLEN", e.key("q:default")))
		return n > 0
	})
	pageWhileMoving(t, in, ListOptions{Filter: Filter{Queue: "default", State: StateScheduled}, Limit: 20},
		func() []string {
			stop()
			ms, err := redis.Strings(admin.Do("ZRANGE", e.key("sched"), 0, -1))
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range ms {
				l, err := redis.Strings(admin.Do("LRANGE", e.key("b:"+m), 0, -1))
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, l...)
			}
			return ids
		}, func() bool {
			n, _ := redis.Int(admin.Do("LLEN", e.key("q:default")))
			return n > 100
		})
}

// commandsPerPage pages through a listing and returns the most commands
// one page sent, as the server's census counts them.
func commandsPerPage(t *testing.T, srv *redistest.Server, in *Inspector, opts ListOptions) (most, pages int) {
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
		cfg.UnknownType = UnknownDead
		cfg.Concurrency = 20
		dead := make([]NewTask, n)
		for i := range dead {
			dead[i] = NewTask{Type: "nobody", Payload: []byte(fmt.Sprintf("dead %d", i)), Options: []Option{Queue("doomed")}}
		}
		if _, err := c.EnqueueBatch(ctx, dead); err != nil {
			t.Fatal(err)
		}
		w, err := NewWorker(e.pool, cfg, NewMux())
		if err != nil {
			t.Fatal(err)
		}
		stop := runBackground(t, w.Run)
		in := c.Inspector()
		waitFor(t, 30*time.Second, "the dead letters", func() bool {
			q, err := in.Queue(ctx, "doomed")
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
		in, _ := NewInspector(srv.Pool(t), e.cfg)
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

// The cursor finds its place again after more than a window of the list
// was consumed between two pages, and after the page's last ids were
// removed (cancelled, deleted): no id twice, none skipped that stayed.
func TestInspectPagingAnchorsMoved(t *testing.T) {
	e := realEnv(t)
	c := e.client(t)
	in := c.Inspector()
	ctx := checkCtx(t, time.Minute)
	const n = 4000
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = NewTask{Type: "t"}
	}
	ids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil {
		t.Fatal(err)
	}
	admin := e.admin(t)
	seen := map[string]bool{}
	take := func(p *TaskPage) {
		for _, v := range p.Tasks {
			if seen[v.ID] {
				t.Fatalf("%s listed twice", v.ID)
			}
			seen[v.ID] = true
		}
	}
	opts := ListOptions{Filter: Filter{Queue: "default", State: StateReady}, Limit: 10}
	p, err := in.ListTasks(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	take(p)
	// Take 1500 (more than the window's slack) from the pop end.
	if res, err := in.Act(ctx, ActionDelete, ids[:1500]...); err != nil || res.Done != 1500 {
		t.Fatalf("delete the first 1500: %+v, %v", res, err)
	}
	opts.Cursor = p.Next
	p, err = in.ListTasks(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	take(p)
	// Remove this page's last three ids (the cursor's anchors).
	for _, v := range p.Tasks[len(p.Tasks)-3:] {
		if _, err := in.Act(ctx, ActionCancel, v.ID); err != nil {
			t.Fatal(err)
		}
	}
	opts.Cursor = p.Next
	pages := 2
	for opts.Cursor != "" {
		p, err = in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		take(p)
		opts.Cursor = p.Next
		pages++
	}
	rest, err := redis.Strings(admin.Do("LRANGE", e.key("q:default"), 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range rest {
		if !seen[id] {
			t.Fatalf("%s stayed ready but was not listed", id)
		}
	}
	if len(rest) < n-1500-20 || len(ids) != n {
		t.Fatalf("%d left of %d", len(rest), n)
	}
	t.Logf("%d listed in %d pages; %d remain", len(seen), pages, len(rest))
	requireClean(t, c)
}
