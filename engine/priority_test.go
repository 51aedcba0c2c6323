package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// eachServer24 is eachServer, and a real Redis 2.4 when REDIS24_SERVER
// names one (skipped, saying so, otherwise).
func eachServer24(t *testing.T, f func(t *testing.T, e *env)) {
	eachServer(t, f)
	t.Run("redis24", func(t *testing.T) { f(t, newEnv(t, redistest.Start24(t))) })
}

// levelOfIndex spreads 1,000 tasks over the four levels in no simple
// order.
func levelOfIndex(i int) int { return (i*7+i/13)%4 + 1 }

// 1,000 tasks of mixed levels in one queue, enqueued while no worker
// runs, start in level order with one worker of one slot: every task of
// level 1 before any of level 2, and so on; taking one task at a time
// (ClaimBatch 1), each level first in, first out; and with batch claims
// and claiming ahead (the defaults), where the tasks of a pop take slots
// after those of the pops before it (processor.reserveTurn), but a pop
// sent behind a result may take its place before one of the fetching
// loop's that ran earlier in Redis, so within a level two pops may start
// in either order.
func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 0} {
		t.Run(fmt.Sprintf("ClaimBatch=%d", batch), func(t *testing.T) {
			t.Parallel()
			eachServer24(t, func(t *testing.T, e *env) {
				e.cfg.Advanced.ClaimBatch = batch
				priorityOrder(t, e, batch == 1)
			})
		})
	}
}

func priorityOrder(t *testing.T, e *env, fifo bool) {
	ctx, cancel := context.WithTimeout(context.Background(), outcomeWait)
	defer cancel()
	c := e.client(t)
	const n = 1000
	order := map[string]int{} // id -> enqueue order
	for at := 0; at < n; at += 100 {
		var batch []NewTask
		for i := at; i < at+100; i++ {
			batch = append(batch, NewTask{Type: "t", Payload: []byte(fmt.Sprint(i)), Options: []Option{Priority(levelOfIndex(i))}})
		}
		infos, err := c.EnqueueBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for j, ti := range infos {
			if ti.Priority != levelOfIndex(at+j) {
				t.Fatalf("task %d enqueued at level %d, want %d", at+j, ti.Priority, levelOfIndex(at+j))
			}
			order[ti.ID] = at + j
		}
	}
	in := e.inspector(t)
	qs, err := in.Queue(ctx, "default")
	if err != nil || qs.Ready != n {
		t.Fatalf("Queue = %+v, %v; want %d ready over every level", qs, err, n)
	}
	e.cfg.Concurrency = 1
	rec := newRecorder(nil)
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, w.Run)
	waitFor(t, outcomeWait, "every task", func() bool { return rec.total() == n })
	stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	lastLevel, lastAt := 0, -1
	for i, task := range rec.seq {
		switch {
		case task.Priority < lastLevel:
			t.Fatalf("run %d: level %d after a task of level %d", i, task.Priority, lastLevel)
		case task.Priority > lastLevel:
			lastLevel, lastAt = task.Priority, -1
		}
		at := order[task.ID]
		if fifo && at < lastAt {
			t.Fatalf("run %d: task %d of level %d after task %d of its level", i, at, task.Priority, lastAt)
		}
		lastAt = max(lastAt, at)
		if task.Priority != levelOfIndex(at) {
			t.Fatalf("run %d: task %d has level %d, enqueued at %d", i, at, task.Priority, levelOfIndex(at))
		}
	}
}

// A delayed task of level 2 and one of level 1 due at the same time (the
// level 2 one enqueued first) are moved together, and start level 1
// first. The worker starts once both are ready: a fetch that found level
// 1 empty just before the move lands may take level 2 first (design.md,
// priority levels), which is not what this test is about.
func TestPriorityDelayedSameTime(t *testing.T) {
	t.Parallel()
	eachServer24(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), outcomeWait)
		defer cancel()
		c := e.client(t)
		// Far enough ahead that both enqueues, on a busy machine too,
		// come before it: each must be scheduled, not ready.
		due := time.Now().Add(2 * time.Second)
		second, err := c.Enqueue(ctx, "t", []byte("2"), At(due), Priority(2))
		if err != nil {
			t.Fatal(err)
		}
		first, err := c.Enqueue(ctx, "t", []byte("1"), At(due))
		if err != nil {
			t.Fatal(err)
		}
		if second.State != StateScheduled || first.State != StateScheduled {
			t.Fatalf("states %s, %s; want both scheduled", second.State, first.State)
		}
		e.cfg.Concurrency = 1
		rec := newRecorder(nil)
		disp, err := NewServer(e.cfg, rec, RoleDispatcher, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		stopDisp := runBackground(t, disp.Run)
		in := c.inspector()
		waitFor(t, outcomeWait, "both tasks ready", func() bool {
			q, err := in.Queue(ctx, "default")
			return err == nil && q.Ready == 2
		})
		stopDisp()
		srv, err := NewServer(e.cfg, rec, RoleWorker, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		waitFor(t, outcomeWait, "both tasks", func() bool { return rec.total() == 2 })
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.seq[0].ID != first.ID || rec.seq[1].ID != second.ID {
			t.Fatalf("ran %s (level %d) then %s (level %d); want level 1 first", rec.seq[0].ID, rec.seq[0].Priority, rec.seq[1].ID, rec.seq[1].Priority)
		}
	})
}

// A task keeps its level through a retry and a snooze: each run sees it,
// and so do Lookup and the Inspector's listing of its level.
func TestPriorityRetrySnooze(t *testing.T) {
	t.Parallel()
	eachServer24(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), outcomeWait)
		defer cancel()
		c := e.client(t)
		var mu sync.Mutex
		var seen []int
		rec := newRecorder(func(_ context.Context, task *Task) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, task.Priority)
			switch len(seen) {
			case 1:
				return errors.New("fail once")
			case 2:
				return Snooze(10 * time.Millisecond)
			}
			return nil
		})
		ti, err := c.Enqueue(ctx, "t", nil, Priority(3))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := NewServer(e.cfg, rec, AllRoles, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		out, err := c.Wait(ctx, ti.ID)
		if err != nil || out.State != StateDone {
			t.Fatalf("Wait = %+v, %v", out, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 3 || seen[0] != 3 || seen[1] != 3 || seen[2] != 3 {
			t.Fatalf("runs saw levels %v; want 3 three times (first run, retry, snooze)", seen)
		}
		got, err := c.Lookup(ctx, ti.ID)
		if err != nil || got.Priority != 3 {
			t.Fatalf("Lookup = %+v, %v; want level 3", got, err)
		}
	})
}

// The option refuses a level out of 1..4, and the Inspector's filter
// lists one level, or every level one after the other, level 1 first.
func TestPriorityOptionAndFilter(t *testing.T) {
	t.Parallel()
	eachServer24(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), outcomeWait)
		defer cancel()
		c := e.client(t)
		for _, bad := range []int{0, -1, 5} {
			if _, err := c.Enqueue(ctx, "t", nil, Priority(bad)); !errors.Is(err, ErrInvalid) {
				t.Errorf("Priority(%d): %v, want ErrInvalid", bad, err)
			}
		}
		want := map[int][]string{}
		for i, lvl := range []int{4, 1, 2, 4, 1, 2, 4} {
			ti, err := c.Enqueue(ctx, "t", []byte(fmt.Sprint(i)), Priority(lvl))
			if err != nil {
				t.Fatal(err)
			}
			want[lvl] = append(want[lvl], ti.ID)
		}
		in := e.inspector(t)
		page, err := in.ListTasks(ctx, ListOptions{Filter: Filter{Queue: "default", State: StateReady, Priority: 2}})
		if err != nil || len(page.Tasks) != 2 || page.Next != "" || page.Tasks[0].ID != want[2][0] || page.Tasks[1].ID != want[2][1] {
			t.Fatalf("level 2: %+v, %v; want %v", page, err, want[2])
		}
		var all []string
		opts := ListOptions{Filter: Filter{Queue: "default", State: StateReady}, Limit: 2}
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("the listing does not end")
			}
			page, err := in.ListTasks(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if page.Total != 7 {
				t.Errorf("total %d, want 7 (every level)", page.Total)
			}
			for _, ti := range page.Tasks {
				all = append(all, ti.ID)
			}
			if page.Next == "" {
				break
			}
			opts.Cursor = page.Next
		}
		wantAll := append(append(append([]string{}, want[1]...), want[2]...), want[4]...)
		if fmt.Sprint(all) != fmt.Sprint(wantAll) {
			t.Fatalf("every level listed %v; want %v (level 1, 2, then 4, each first in, first out)", all, wantAll)
		}
		if _, err := in.ListTasks(ctx, ListOptions{Filter: Filter{Queue: "default", State: StateReady, Priority: 5}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("filter of level 5: %v, want ErrInvalid", err)
		}
		res, err := in.ActAll(ctx, ActionDelete, Filter{Queue: "default", State: StateReady, Priority: 4})
		if err != nil || res.Done != 3 {
			t.Fatalf("delete level 4: %+v, %v; want 3 done", res, err)
		}
		q, err := in.Queue(ctx, "default")
		if err != nil || q.Ready != 4 {
			t.Fatalf("Queue = %+v, %v; want 4 ready", q, err)
		}
	})
}

// inspector is a lane inspector over the test's namespace.
func (e *env) inspector(t testing.TB) *laneInspector {
	t.Helper()
	in, err := newLaneInspector(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}
