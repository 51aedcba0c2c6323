package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// pageWhileMoving pages through a listing while tasks leave it, and
// checks that no id comes twice and that every id still in the listed
// structure at the end (so in it the whole time) was listed. Between two
// pages it calls between, which lets tasks move (or waits until some
// did).
func pageWhileMoving(t *testing.T, in *laneInspector, opts ListOptions, remaining func() []string, moved func() bool, between func()) {
	t.Helper()
	ctx := checkCtx(t, pagingCtx)
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
		between()
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

// pagingCtx bounds each paging test's calls. It outlasts outcomeWait: a
// wait whose condition calls with an ended context would only time out,
// and say nothing of why.
const pagingCtx = outcomeWait + time.Minute

// eventPacer is an Observer that lets a listing wait, between two pages,
// for an event of its kind (one more task moved), until n tasks moved.
type eventPacer struct {
	kind  EventKind
	n     int64
	moved atomic.Int64
	next  chan struct{} // holds a token when an event came since the last wait
	all   chan struct{} // closed once n tasks moved
	once  sync.Once
}

func newEventPacer(kind EventKind, n int) *eventPacer {
	return &eventPacer{kind: kind, n: int64(n), next: make(chan struct{}, 1), all: make(chan struct{})}
}

func (p *eventPacer) Observe(ev Event) {
	if ev.Kind != p.kind {
		return
	}
	moved := int64(1)
	if ev.Kind == EventDispatched {
		moved = int64(ev.Moved)
	}
	if p.moved.Add(moved) >= p.n {
		p.once.Do(func() { close(p.all) })
	}
	select {
	case p.next <- struct{}{}:
	default:
	}
}

// wait returns once a task moved since the last wait, or all n did.
func (p *eventPacer) wait(t testing.TB) {
	t.Helper()
	select {
	case <-p.next:
	case <-p.all:
	case <-time.After(outcomeWait):
		t.Fatalf("no %v event in %v (%d of %d moved)", p.kind, outcomeWait, p.moved.Load(), p.n)
	}
}

// Paging the ready list while workers consume it.
func TestInspectPagingReadyWhileConsumed(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.Concurrency = 4
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, pagingCtx)
	const n = 3000
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = NewTask{Type: "t", Payload: []byte(fmt.Sprint(i))}
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// The handlers run in step with the listing: each page lets a few
	// more tasks through.
	var ran atomic.Int64
	turns, over := make(chan struct{}, n), make(chan struct{})
	w, err := newWorker(e.pool, e.cfg, HandlerFunc(func(context.Context, *Task) error {
		ran.Add(1)
		select {
		case <-turns:
		case <-over:
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, w.Run)
	waitFor(t, outcomeWait, "the worker to start", func() bool { return ran.Load() > 0 })
	admin := e.admin(t)
	pageWhileMoving(t, in, ListOptions{Filter: Filter{Queue: "default", State: StateReady}, Limit: 25},
		func() []string {
			close(over)
			stop()
			ids, err := redis.Strings(admin.Do("LRANGE", e.key("q:default"), 0, -1))
			if err != nil {
				t.Fatal(err)
			}
			return ids
		}, func() bool { return ran.Load() > 100 },
		func() {
			// Two tasks end, and the next page waits for the slots they
			// free to take two more from the list.
			before := ran.Load()
			turns <- struct{}{}
			turns <- struct{}{}
			waitFor(t, outcomeWait, "two more tasks taken", func() bool { return ran.Load() >= before+2 || ran.Load() == n })
		})
}

// Paging the scheduled tasks while the dispatcher moves their buckets.
func TestInspectPagingScheduledWhileDispatched(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.Advanced.Resolution = time.Millisecond
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, pagingCtx)
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
	pacer := newEventPacer(EventDispatched, n)
	e.cfg.Observer = pacer
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, d.Run)
	admin := e.admin(t)
	waitFor(t, outcomeWait, "the dispatcher to start moving", func() bool {
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
		}, func() { pacer.wait(t) })
}

// The cursor finds its place again after more than a window of the list
// was consumed between two pages, and after the page's last ids were
// removed (cancelled, deleted): no id twice, none skipped that stayed.
func TestInspectPagingAnchorsMoved(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, pagingCtx)
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

// Paging the dead letters while workers bury more and the listed ones
// are retried: newest first by the time they died, so new ones land
// before the walk and are not listed, and every one that stayed dead is.
func TestInspectPagingDeadWhileBurying(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.UnknownType = "dead"
	e.cfg.Advanced.UnknownTypeGrace = -1 // no worker serves "nobody": dead at once
	e.cfg.Concurrency = 4
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, pagingCtx)
	batch := make([]NewTask, 1500)
	for i := range batch {
		batch[i] = NewTask{Type: "nobody"}
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	pacer := newEventPacer(EventDead, len(batch))
	e.cfg.Observer = pacer
	w, err := newWorker(e.pool, e.cfg, NewMux())
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, w.Run)
	var seen string // the queue as the wait last read it, said when the test fails
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("default queue, last read: %s", seen)
		}
	})
	waitFor(t, outcomeWait, "1000 dead letters", func() bool {
		q, err := in.Queue(ctx, "default")
		if err != nil {
			seen = err.Error()
			return false
		}
		seen = fmt.Sprintf("%+v", *q)
		return q.Dead >= 1000
	})
	admin := e.admin(t)
	dead := func() []string {
		ids, err := redis.Strings(admin.Do("ZRANGE", e.key("dead"), 0, -1))
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// Those buried after the listing began are newer than its first page:
	// the listing does not promise them.
	atStart := map[string]bool{}
	for _, id := range dead() {
		atStart[id] = true
	}
	pageWhileMoving(t, in, ListOptions{Filter: Filter{Queue: "default", State: StateDead}, Limit: 20},
		func() []string {
			stop()
			var stayed []string
			for _, id := range dead() {
				if atStart[id] {
					stayed = append(stayed, id)
				}
			}
			return stayed
		}, func() bool { return len(dead()) > len(atStart) },
		func() { pacer.wait(t) })
}

// Paging the running tasks while they finish and others start.
func TestInspectPagingRunningWhileFinishing(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.Concurrency = 40
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, pagingCtx)
	batch := make([]NewTask, 2000)
	for i := range batch {
		batch[i] = NewTask{Type: "t", Payload: []byte{byte(i % 10 * 3)}}
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var ran, held atomic.Int64
	release := make(chan struct{}) // closed after the listing: ends every task
	turns := make(chan struct{}, len(batch))
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		ran.Add(1)
		// One in ten runs until the listing is over, the rest until a
		// page of the listing lets them end.
		if t.Payload[0] == 0 {
			held.Add(1)
			<-release
			return nil
		}
		select {
		case <-turns:
		case <-release:
		}
		return nil
	})
	var stops []func()
	var workers []*worker
	for i := 0; i < 2; i++ {
		w, err := newWorker(e.pool, e.cfg, h)
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		stops = append(stops, runBackground(t, w.Run))
	}
	waitFor(t, outcomeWait, "tasks running", func() bool {
		q, err := in.Queue(ctx, "default")
		return err == nil && q.Running >= 40
	})
	admin := e.admin(t)
	pending := func() map[string]bool {
		out := map[string]bool{}
		for _, w := range workers {
			ids, err := redis.Strings(admin.Do("ZRANGE", e.key("p:"+w.ID()), 0, -1))
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				out[id] = true
			}
		}
		return out
	}
	atStart, ranAtStart := pending(), ran.Load()
	pageWhileMoving(t, in, ListOptions{Filter: Filter{Queue: "default", State: StateRunning}, Limit: 3},
		func() []string {
			var stayed []string
			for id := range pending() {
				if atStart[id] {
					stayed = append(stayed, id)
				}
			}
			close(release)
			for _, stop := range stops {
				stop()
			}
			return stayed
		}, func() bool { return ran.Load() > ranAtStart },
		func() {
			// Two tasks end, and the next page waits for two more to
			// start in their slots, unless the tasks held to the end
			// fill every slot.
			before := ran.Load()
			turns <- struct{}{}
			turns <- struct{}{}
			waitFor(t, outcomeWait, "two more tasks started", func() bool {
				return ran.Load() >= before+2 || held.Load() == int64(len(workers)*e.cfg.Concurrency) || ran.Load() == int64(len(batch))
			})
		})
}
