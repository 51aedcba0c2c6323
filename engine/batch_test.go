package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// batchStore passes every call to the real store and records the sizes
// of the batches popped, claimed and finished together, and the queue
// of each pop that found tasks, in order.
type batchStore struct {
	store
	maxClaim, maxGroup atomic.Int64
	// held: groups recorded with a batch claim's watch; heldLost: groups
	// whose watch a change voided (recorded the checked way after).
	held, heldLost atomic.Int64
	// chained: groups whose round trip took the next batch (the pops
	// sent behind their EXEC found tasks).
	chained atomic.Int64
	mu      sync.Mutex
	pops    []string // guarded by mu
}

func (b *batchStore) popped(q string, n int) {
	if n > 0 {
		b.mu.Lock()
		b.pops = append(b.pops, q)
		b.mu.Unlock()
	}
}

func (b *batchStore) Pop(ctx context.Context, l *lane, p string, n int) (popRes, error) {
	r, err := b.store.Pop(ctx, l, p, n)
	b.popped(p, len(r.ids))
	return r, err
}

func (b *batchStore) Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	raise(&b.maxClaim, len(ids))
	return b.store.Claim(ctx, l, p, ids, cs, hold)
}

// Finish counts groups: results of more than one run recorded together.
func (b *batchStore) Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error) {
	res, err := b.store.Finish(ctx, l, req)
	group := len(req.items) > 1
	if group {
		raise(&b.maxGroup, len(req.items))
	}
	switch {
	case err == nil && res.held && group:
		b.held.Add(1)
	case err == nil && req.held && !res.held:
		b.heldLost.Add(1)
	}
	if group && len(res.popped) > 0 {
		b.chained.Add(1)
		b.popped(req.pop, len(res.popped))
	}
	return res, err
}

func raise(v *atomic.Int64, n int) {
	for {
		cur := v.Load()
		if int64(n) <= cur || v.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

// Every task runs exactly once (a failed first attempt exactly twice) at
// every claim batch size, with two worker processes competing for one
// deep queue: batches are claimed, results recorded in groups, and the
// gauges end where they started.
func TestBatchExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		k      int
		window time.Duration
	}{{1, 0}, {2, 0}, {8, 0}, {32, 0}, {8, -1}} {
		k := tc.k
		name := fmt.Sprintf("K=%d", k)
		if tc.window < 0 {
			name += ",no-group-commit"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := realEnv(t)
			ctx := context.Background()
			c := e.client(t)
			const n = 3000
			var batch []NewTask
			for i := range n {
				batch = append(batch, NewTask{Type: "t", Payload: []byte(fmt.Sprint(i % 10))})
			}
			infos, err := c.EnqueueBatch(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			// A tenth of the tasks fail their first run and retry at once.
			rec := newRecorder(func(ctx context.Context, task *Task) error {
				if string(task.Payload) == "0" && task.Attempt == 1 {
					return errors.New("first run fails")
				}
				return nil
			})
			e.cfg.Concurrency = 16
			e.cfg.Advanced.ClaimBatch = k
			e.cfg.Advanced.GroupCommitWindow = tc.window
			e.cfg.RetryDelay = func(*Task, int, error) time.Duration { return -1 }
			// The retries wait in a bucket for the dispatcher.
			d, err := newDispatcher(e.pool, e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			runBackground(t, d.Run)
			var stores []*batchStore
			for range 2 {
				w, err := newWorker(e.pool, e.cfg, rec)
				if err != nil {
					t.Fatal(err)
				}
				bs := &batchStore{store: w.store}
				w.setStore(bs)
				stores = append(stores, bs)
				runBackground(t, w.Run)
			}
			want := n + n/10
			waitFor(t, outcomeWait, "every run", func() bool { return rec.total() >= want })
			waitFor(t, outcomeWait, "every result recorded", func() bool {
				st, err := c.inspector().Queue(ctx, "default")
				return err == nil && st.Processed == n && st.Running == 0
			})
			for i, info := range infos {
				runs := 1
				if i%10 == 0 {
					runs = 2
				}
				if got := rec.count(info.ID); got != runs {
					t.Fatalf("task %d ran %d times, want %d", i, got, runs)
				}
			}
			if got := rec.total(); got != want {
				t.Fatalf("%d runs, want %d", got, want)
			}
			st, err := c.inspector().Queue(ctx, "default")
			if err != nil {
				t.Fatal(err)
			}
			if st.Ready != 0 || st.Running != 0 || st.Retrying != 0 || st.Dead != 0 || st.Failed != n/10 {
				t.Errorf("queue after the run: %+v", st)
			}
			var claim, group, held int64
			for _, bs := range stores {
				claim, group = max(claim, bs.maxClaim.Load()), max(group, bs.maxGroup.Load())
				held += bs.held.Load()
			}
			t.Logf("largest claim batch %d, largest result group %d, groups recorded with the claim's watch %d", claim, group, held)
			if k > 1 && tc.window >= 0 && held == 0 {
				t.Errorf("no result group recorded with its batch claim's watch")
			}
			if tc.window < 0 && held > 0 {
				t.Errorf("%d groups recorded with a held watch with group commit off", held)
			}
			if claim > int64(k) {
				t.Errorf("a claim batch of %d, above ClaimBatch %d", claim, k)
			}
			if tc.window < 0 && group > 0 {
				t.Errorf("a result group of %d with group commit off", group)
			}
			if k > 1 && (claim < 2 || group < 2 && tc.window >= 0) {
				t.Errorf("no batch claimed (%d) or no group recorded (%d) from a deep queue", claim, group)
			}
		})
	}
}

// Under strict priority a worker taking batches never pops a lower queue
// while a higher one has tasks.
func TestBatchStrictPriority(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	c := e.client(t)
	const n = 2000
	for _, q := range []string{"low", "high"} {
		var batch []NewTask
		for range n {
			batch = append(batch, NewTask{Type: "t", Options: []Option{Queue(q)}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg.StrictPriority = true
	e.cfg.Queues = []QueueConfig{{Name: "high"}, {Name: "low"}}
	e.cfg.Concurrency = 16
	rec := newRecorder(nil)
	w, _ := newWorker(e.pool, e.cfg, rec)
	bs := &batchStore{store: w.store}
	w.setStore(bs)
	stop := runBackground(t, w.Run)
	waitFor(t, outcomeWait, "all tasks", func() bool { return rec.total() == 2*n })
	stop()
	bs.mu.Lock()
	defer bs.mu.Unlock()
	low := false
	for i, q := range bs.pops {
		if q == "low" {
			low = true
		} else if low {
			t.Fatalf("pop %d took from high after low was popped", i)
		}
	}
	if bs.maxClaim.Load() < 2 {
		t.Errorf("no batch claimed from deep queues")
	}
}

// stallStore holds back the first result group of full size until
// released, recording how many runs had started when it arrived.
type stallStore struct {
	store
	full     int
	once     sync.Once
	arrived  chan struct{}
	release  chan struct{}
	rec      *recorder
	runsThen atomic.Int64
}

func (s *stallStore) Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error) {
	if err := s.stall(ctx, len(req.items)); err != nil {
		return finishRes{}, err
	}
	return s.store.Finish(ctx, l, req)
}

// stall holds back the first group of n == full results until released.
func (s *stallStore) stall(ctx context.Context, n int) error {
	if n == s.full {
		first := false
		s.once.Do(func() { first = true })
		if first {
			s.runsThen.Store(int64(s.rec.total()))
			close(s.arrived)
			select {
			case <-s.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// A waiter that starts waiting for tasks of a batch while they run marks
// them, which voids the watch the batch claim left for their results: the
// group is recorded the checked way, which reads the marks and pushes the
// completion list of each task marked (and of no other: the done records
// are kept longer than the lists, so an unwaited success writes none).
// Every task runs once.
func TestBatchHeldWatchVoidedByWaiter(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := e.client(t)
	const n, slots = 64, 8
	var batch []NewTask
	for i := range n {
		batch = append(batch, NewTask{Type: "t", Payload: []byte(fmt.Sprint(i % 4))})
	}
	infos, err := c.EnqueueBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Concurrency = slots
	e.cfg.Advanced.ClaimBatch = slots
	e.cfg.Advanced.GroupCommitWindow = 50 * time.Millisecond
	admin := e.admin(t)
	var mu sync.Mutex
	rec := newRecorder(func(hctx context.Context, task *Task) error {
		if string(task.Payload) == "0" {
			// As Wait's first Completed does.
			mu.Lock()
			_, err := admin.Do("SETEX", e.key("cw:"+task.ID), buckets.WaiterTTL, 1)
			mu.Unlock()
			if err != nil {
				return Permanent(err)
			}
		}
		return nil
	})
	_, bs := runRecorded(t, e, c, rec, n)
	for i, info := range infos {
		if got := rec.count(info.ID); got != 1 {
			t.Fatalf("task %d ran %d times, want 1", i, got)
		}
		mu.Lock()
		has, err := redis.Int(admin.Do("EXISTS", e.key("c:"+info.ID)))
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if want := i%4 == 0; (has == 1) != want {
			t.Errorf("task %d: completion list %v, want %v", i, has == 1, want)
		}
	}
	if bs.heldLost.Load() == 0 {
		t.Errorf("no held group voided by a waiter's mark (held groups %d)", bs.held.Load())
	}
}

// runRecorded runs a worker of e with handler rec, its store counted (a
// batchStore), until the default queue has n tasks processed and none
// running.
func runRecorded(t *testing.T, e *env, c *laneClient, rec *recorder, n int) (*worker, *batchStore) {
	t.Helper()
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	bs := &batchStore{store: w.store}
	w.setStore(bs)
	runBackground(t, w.Run)
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(context.Background(), "default")
		return err == nil && st.Processed == int64(n) && st.Running == 0
	})
	return w, bs
}

// deepQueue enqueues n tasks of type "t" in one batch, and sets workers
// of e to slots slots that take batches of them all.
func deepQueue(t *testing.T, n, slots int) (*env, *laneClient, []*TaskInfo) {
	t.Helper()
	e := realEnv(t)
	c := e.client(t)
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = NewTask{Type: "t"}
	}
	infos, err := c.EnqueueBatch(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Concurrency = slots
	e.cfg.Advanced.ClaimBatch = slots
	return e, c, infos
}

// A result group that holds every slot gives them back before its round
// trip ends: the next batch runs while it is recorded. The results handed
// over and not yet recorded stay bounded: with the group stalled, no more
// than one more batch of slots runs. Every task still runs exactly once.
func TestGroupFreesSlotsWhenSaturated(t *testing.T) {
	t.Parallel()
	const n, slots = 400, 4
	e, c, infos := deepQueue(t, n, slots)
	ctx := context.Background()
	e.cfg.Advanced.GroupCommitMax = slots // unrecorded results: at most max(slots, GroupCommitMax)
	e.cfg.Advanced.GroupCommitWindow = 50 * time.Millisecond
	rec := newRecorder(nil)
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	ss := &stallStore{store: w.store, full: slots, arrived: make(chan struct{}), release: make(chan struct{}), rec: rec}
	w.setStore(ss)
	// A group of every slot from a deep queue takes the next batch with
	// its result (TestBatchTakesNextWithResult) and keeps its slots: here
	// it gives them back.
	w.proc.unchained = true
	runBackground(t, w.Run)
	select {
	case <-ss.arrived:
	case <-time.After(outcomeWait):
		t.Fatal("no result group of every slot")
	}
	then := int(ss.runsThen.Load())
	waitFor(t, outcomeWait, "a run while the group is stalled", func() bool { return rec.total() > then })
	// real time: what is tested is that nothing more runs while the group
	// is stalled, an absence of events; the worker gets time to run more
	// than it may.
	time.Sleep(300 * time.Millisecond)
	if got := rec.total() - then; got > slots {
		t.Errorf("%d runs while a group of every slot was stalled, want at most %d (the bound of unrecorded results)", got, slots)
	}
	close(ss.release)
	waitFor(t, outcomeWait, "every run", func() bool { return rec.total() >= n })
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(ctx, "default")
		return err == nil && st.Processed == n && st.Running == 0
	})
	for i, info := range infos {
		if got := rec.count(info.ID); got != 1 {
			t.Fatalf("task %d ran %d times, want 1", i, got)
		}
	}
}

// From a deep queue, a batch of every slot records its results and pops
// the next batch in one round trip, and goes on with it: every task still
// runs exactly once, the counters add up, and no id is left in the
// worker's in-flight list.
func TestBatchTakesNextWithResult(t *testing.T) {
	t.Parallel()
	const n, slots = 400, 4
	e, c, infos := deepQueue(t, n, slots)
	e.cfg.Advanced.GroupCommitWindow = 50 * time.Millisecond
	rec := newRecorder(nil)
	w, bs := runRecorded(t, e, c, rec, n)
	for i, info := range infos {
		if got := rec.count(info.ID); got != 1 {
			t.Fatalf("task %d ran %d times, want 1", i, got)
		}
	}
	bs.mu.Lock()
	pops := len(bs.pops)
	bs.mu.Unlock()
	t.Logf("pops that took tasks %d, of which sent with a result group %d", pops, bs.chained.Load())
	if bs.chained.Load() == 0 {
		t.Errorf("no result group took the next batch")
	}
	if got := rec.total(); got != n {
		t.Errorf("%d runs, want %d", got, n)
	}
	left, err := redis.Int(e.admin(t).Do("LLEN", e.key("f:"+w.id)))
	if err != nil || left != 0 {
		t.Errorf("in-flight list after the run: %d ids (%v), want none", left, err)
	}
}

// Runs whose claim kept a watch for their results (a task claimed alone,
// a held batch) record them without the committer, so the committer does
// not count them among those that may join its group: with only such runs
// running, a result handed to it is recorded without waiting the window.
func TestCommitterCountsOnlyRunsThatJoinIt(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	c := e.client(t)
	const slots = 4
	var batch []NewTask
	for range 2 * slots {
		batch = append(batch, NewTask{Type: "t"})
	}
	if _, err := c.EnqueueBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	e.cfg.Concurrency = slots
	e.cfg.Advanced.ClaimBatch = slots
	e.cfg.Advanced.GroupCommitWindow = 50 * time.Millisecond
	release := make(chan struct{})
	var started atomic.Int32
	rec := newRecorder(func(context.Context, *Task) error {
		started.Add(1)
		<-release
		return nil
	})
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
	waitFor(t, outcomeWait, "every slot running", func() bool { return started.Load() == slots })
	if n := w.proc.running.Load(); n != 0 {
		t.Errorf("the committer counts %d runs that may join it; want 0 (every run holds its claim's watch)", n)
	}
	close(release)
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(ctx, "default")
		return err == nil && st.Processed == 2*slots && st.Running == 0
	})
	if n := w.proc.running.Load(); n != 0 {
		t.Errorf("%d runs counted after all ended", n)
	}
}
