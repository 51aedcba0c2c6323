package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// requeueStore counts the tasks a worker gave back unstarted, and keeps
// the ids of each Requeue that did, and of each claimed run that had
// another claimed after it in its batch.
type requeueStore struct {
	*batchStore
	unstarted atomic.Int64
	mu        sync.Mutex
	calls     [][]string
	followed  map[string]bool
}

func (s *requeueStore) Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	recs, res, err := s.batchStore.Claim(ctx, l, p, ids, cs, hold)
	var prev string
	s.mu.Lock()
	for _, r := range recs {
		if r == nil {
			continue
		}
		if prev != "" {
			s.followed[prev] = true
		}
		prev = r.ID
	}
	s.mu.Unlock()
	return recs, res, err
}

// countRequeues puts a requeueStore in front of w's store, and returns it.
func countRequeues(w *worker) *requeueStore {
	rs := &requeueStore{batchStore: &batchStore{store: w.store}, followed: map[string]bool{}}
	w.setStore(rs)
	return rs
}

// hasFollower reports whether a run of its batch was claimed after id's.
func (s *requeueStore) hasFollower(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.followed[id]
}

func (s *requeueStore) Requeue(ctx context.Context, l *lane, ids []string, why buckets.Reason) (buckets.RequeueResult, error) {
	res, err := s.batchStore.Requeue(ctx, l, ids, why)
	if err == nil && why == buckets.Unstarted {
		s.unstarted.Add(int64(len(ids)))
		s.mu.Lock()
		s.calls = append(s.calls, append([]string(nil), ids...))
		s.mu.Unlock()
	}
	return res, err
}

// takeCalls returns the unstarted Requeues' ids so far and forgets them.
func (s *requeueStore) takeCalls() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

// concurrent counts the handlers running at once, and the most seen.
type concurrent struct{ now, most atomic.Int64 }

func (c *concurrent) enter() { raise(&c.most, int(c.now.Add(1))) }
func (c *concurrent) exit()  { c.now.Add(-1) }

// prefetchWorker starts a worker of e with handler rec, its store counted.
func prefetchWorker(t *testing.T, e *env, rec *recorder) (*worker, *requeueStore, func()) {
	t.Helper()
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	rs := countRequeues(w)
	return w, rs, runBackground(t, w.Run)
}

// quickWorker starts a worker of e whose handler returns at once,
// counting the handlers that run at once.
func quickWorker(t *testing.T, e *env) (*worker, *requeueStore, *recorder, *concurrent) {
	t.Helper()
	cc := &concurrent{}
	rec := newRecorder(func(context.Context, *Task) error {
		cc.enter()
		defer cc.exit()
		return nil
	})
	w, rs, _ := prefetchWorker(t, e, rec)
	return w, rs, rec, cc
}

// From a deep queue of quick tasks a worker claims ahead of its slots: a
// batch takes more tasks than Concurrency, yet no more handlers run at
// once than Concurrency, and every task runs exactly once.
func TestPrefetchClaimsAheadOfSlots(t *testing.T) {
	t.Parallel()
	const n, slots = 600, 4
	e, c, infos := deepQueue(t, n, slots)
	e.cfg.Advanced.ClaimBatch = 16 // Prefetch: 12 by default
	w, rs, rec, cc := quickWorker(t, e)
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(context.Background(), "default")
		return err == nil && st.Processed == n && st.Running == 0
	})
	for i, info := range infos {
		if got := rec.count(info.ID); got != 1 {
			t.Fatalf("task %d ran %d times, want 1", i, got)
		}
	}
	claim := rs.maxClaim.Load()
	t.Logf("largest claim %d, most handlers at once %d, chained batches %d", claim, cc.most.Load(), w.Chained())
	if claim <= slots {
		t.Errorf("largest claim %d: never claimed ahead of %d slots", claim, slots)
	}
	if w.ClaimedAhead() == 0 {
		t.Errorf("no task waited for a slot after being claimed ahead")
	}
	if claim > 16 {
		t.Errorf("a claim of %d, above ClaimBatch 16", claim)
	}
	if most := cc.most.Load(); most > slots {
		t.Errorf("%d handlers ran at once, Concurrency is %d", most, slots)
	}
	if u := rs.unstarted.Load(); u != 0 {
		t.Errorf("%d tasks given back unstarted while the worker ran", u)
	}
}

// A queue's concurrency limit far from binding leaves claiming ahead on;
// one the worker's tasks could fill (its slots plus prefetch) turns it
// off, so that no slot of the limit is held by a task waiting for a
// handler. Never more tasks run than the limit.
func TestPrefetchOnLimitedQueue(t *testing.T) {
	t.Parallel()
	const n, slots = 400, 4
	for _, tc := range []struct {
		limit int
		ahead bool
	}{{1000, true}, {12, false}} {
		t.Run(fmt.Sprintf("limit%d", tc.limit), func(t *testing.T) {
			t.Parallel()
			e, c, _ := deepQueue(t, n, slots)
			e.cfg.Advanced.ClaimBatch = 16 // Prefetch: 12 by default, so 16 tasks held at most
			if err := c.SetQueueLimits(context.Background(), QueueConfig{Name: "default", MaxRunning: tc.limit}); err != nil {
				t.Fatal(err)
			}
			w, rs, _, cc := quickWorker(t, e)
			waitFor(t, outcomeWait, "every result recorded", func() bool {
				st, err := c.inspector().Queue(context.Background(), "default")
				return err == nil && st.Processed == n && st.Running == 0 && st.SlotsInUse == 0
			})
			claim, ahead := rs.maxClaim.Load(), w.ClaimedAhead()
			t.Logf("largest claim %d, claimed ahead %d, most handlers at once %d", claim, ahead, cc.most.Load())
			if tc.ahead && (claim <= slots || ahead == 0) {
				t.Errorf("limit %d: largest claim %d, %d claimed ahead: never claimed ahead of %d slots", tc.limit, claim, ahead, slots)
			}
			if !tc.ahead && (claim > slots || ahead != 0) {
				t.Errorf("limit %d: largest claim %d, %d claimed ahead: claimed ahead of %d slots", tc.limit, claim, ahead, slots)
			}
			if most := cc.most.Load(); most > slots {
				t.Errorf("%d handlers ran at once, Concurrency is %d", most, slots)
			}
		})
	}
}

// Handlers slower than PrefetchWait allows turn claiming ahead off: no
// claim takes more tasks than there are slots.
func TestPrefetchOffForSlowHandlers(t *testing.T) {
	t.Parallel()
	const n, slots = 60, 2
	e, c, _ := deepQueue(t, n, slots)
	e.cfg.Advanced.ClaimBatch = 16
	rec := newRecorder(func(context.Context, *Task) error {
		// real time: the handlers' duration against PrefetchWait is what
		// turns claiming ahead off (7 tasks ahead a slot: 70 ms > 5 ms).
		time.Sleep(10 * time.Millisecond)
		return nil
	})
	_, rs, _ := prefetchWorker(t, e, rec)
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(context.Background(), "default")
		return err == nil && st.Processed == n && st.Running == 0
	})
	if claim := rs.maxClaim.Load(); claim > slots {
		t.Errorf("a claim of %d with handlers of 10 ms, want at most %d (no claiming ahead)", claim, slots)
	}
	if got := rec.total(); got != n {
		t.Errorf("%d runs, want %d", got, n)
	}
}

// stuckSetup is a worker of a deep queue whose handler returns at once
// for its first 100 runs (so that the worker claims ahead), and after
// those blocks until open is called, counting the blocked runs. The run
// that would take the last free slot blocks only when a run of its batch
// was claimed after it, which then waits for a slot; otherwise it returns
// at once too. The worker stops claiming ahead once every slot stays
// taken past PrefetchWait, so a last block with nothing claimed ahead
// would leave nothing to give back, however long the test waited (a busy
// machine's pause between the claims did that).
type stuckSetup struct {
	e       *env
	c       *laneClient
	infos   []*TaskInfo
	w       *worker
	rs      *requeueStore
	rec     *recorder
	blocked atomic.Int64
	open    func() // unblocks the handlers, once; the test's cleanup too
}

// newStuckSetup starts a stuckSetup of n tasks, slots handlers, claims of
// up to claimBatch, PrefetchWait wait and, when grace is not 0, that
// LeaseGrace. The worker claims ahead while the handlers' mean run, times
// the tasks claimed ahead per slot (up to 7 here), is within wait, and
// while its slots were all taken for less than wait: a test that needs
// claims ahead to happen under a loaded machine's pauses (the race
// detector, every package's tests at once) sets it long.
func newStuckSetup(t *testing.T, n, slots, claimBatch int, grace, wait time.Duration) *stuckSetup {
	t.Helper()
	st := &stuckSetup{}
	st.e, st.c, st.infos = deepQueue(t, n, slots)
	st.e.cfg.Advanced.ClaimBatch = claimBatch
	st.e.cfg.Advanced.PrefetchWait = wait
	if grace != 0 {
		st.e.cfg.Advanced.LeaseGrace = grace
	}
	release := make(chan struct{})
	var runs atomic.Int64
	var started atomic.Pointer[requeueStore] // the handlers run before prefetchWorker returns
	st.rec = newRecorder(func(_ context.Context, task *Task) error {
		if runs.Add(1) <= 100 {
			return nil
		}
		if rs := started.Load(); rs == nil || !st.blockOne(slots, rs.hasFollower(task.ID)) {
			return nil
		}
		<-release
		return nil
	})
	st.w, st.rs, _ = prefetchWorker(t, st.e, st.rec)
	started.Store(st.rs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runs %d, largest claim %d, mean run %v, blocked %d",
				runs.Load(), st.rs.maxClaim.Load(), time.Duration(st.w.proc.meanRun.Load()), st.blocked.Load())
		}
	})
	// Registered after the worker's: cleanups run last registered
	// first, so a test that fails before it opens still unblocks the
	// handlers before the worker is stopped.
	var once sync.Once
	st.open = func() { once.Do(func() { close(release) }) }
	t.Cleanup(st.open)
	return st
}

// blockOne counts a run that blocks: one of the first slots-1, or the
// last one when a run of its batch claimed after it waits (followed). It
// reports whether it did.
func (st *stuckSetup) blockOne(slots int, followed bool) bool {
	for {
		b := st.blocked.Load()
		if b >= int64(slots) || (b == int64(slots)-1 && !followed) {
			return false
		}
		if st.blocked.CompareAndSwap(b, b+1) {
			return true
		}
	}
}

// queue reads the default queue's figures.
func (st *stuckSetup) queue() (*QueueInfo, error) {
	return st.c.inspector().Queue(context.Background(), "default")
}

// A graceful shutdown gives the tasks claimed ahead back to the front of
// their queue at once, unstarted and not counted as recovered, while the
// handlers that started finish; no task is lost or runs twice.
func TestPrefetchShutdownGivesBackAtOnce(t *testing.T) {
	t.Parallel()
	const n, slots = 400, 2
	su := newStuckSetup(t, n, slots, 16, 0, 150*time.Millisecond)
	e, c, infos, w, rs, rec := su.e, su.c, su.infos, su.w, su.rs, su.rec
	ctx := context.Background()
	waitFor(t, outcomeWait, "both slots blocked", func() bool { return su.blocked.Load() == slots })
	if claim := rs.maxClaim.Load(); claim <= slots {
		t.Fatalf("largest claim %d: the worker never claimed ahead", claim)
	}
	// The tasks claimed with the blocked ones, and those of the pops
	// right after (within PrefetchWait of the last slot freed), wait.
	waitFor(t, outcomeWait, "tasks claimed ahead waiting for a slot", func() bool { return w.proc.waiting.Load() > 0 })
	done := make(chan error, 1)
	go func() { done <- w.Shutdown(ctx) }()
	// Only the two blocked handlers' tasks stay running: the others are
	// back while those handlers still block (they are let go below). The
	// bound is generous for a loaded machine: a give-back is one Requeue
	// a batch, tens of milliseconds under the race detector here.
	waitFor(t, outcomeWait, "tasks claimed ahead given back", func() bool {
		st, err := c.inspector().Queue(ctx, "default")
		return err == nil && st.Running == slots
	})
	su.open()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	st, err := c.inspector().Queue(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	ran := rec.total()
	t.Logf("runs %d, given back unstarted %d, queue %+v", ran, rs.unstarted.Load(), st)
	if rs.unstarted.Load() == 0 {
		t.Errorf("no task given back unstarted")
	}
	// Each Requeue gave back the rest of one batch, in enqueue order.
	place := make(map[string]int, len(infos))
	for i, info := range infos {
		place[info.ID] = i
	}
	for _, ids := range rs.takeCalls() {
		for j := 1; j < len(ids); j++ {
			if place[ids[j]] != place[ids[j-1]]+1 {
				t.Errorf("given back together out of enqueue order: %v", ids)
				break
			}
		}
	}
	if n := w.proc.waiting.Load(); n != 0 {
		t.Errorf("%d tasks still waiting for a slot after the shutdown", n)
	}
	if int(st.Processed)+int(st.Ready) != n || st.Running != 0 || st.Dead != 0 {
		t.Errorf("after shutdown: %+v, want processed + ready = %d", st, n)
	}
	conn := e.admin(t)
	defer conn.Close()
	for i, info := range infos {
		got := rec.count(info.ID)
		if got > 1 {
			t.Fatalf("task %d ran %d times", i, got)
		}
		if r := e.record(t, conn, info.ID); r != nil && r.Recoveries != 0 {
			t.Errorf("task %d: %d recoveries, want none (given back unstarted)", i, r.Recoveries)
		}
	}
}

// A task claimed ahead that waits for a slot past half of LeaseGrace goes
// back to its queue unstarted before its lease could run out under its
// run; it runs later, once, and is not counted as recovered.
func TestPrefetchGivesBackPastHalfTheGrace(t *testing.T) {
	t.Parallel()
	const n, slots = 400, 1
	// The blocked run needs a follower: a task claimed ahead with it. Its
	// PrefetchWait is the most there is (1 s, past half the grace: a
	// task claimed ahead then goes back, which is what is tested), so
	// that claims ahead go on through a loaded machine's pauses: at
	// 150 ms a loaded run of the test command timed out waiting for a
	// run with a follower.
	su := newStuckSetup(t, n, slots, 8, 400*time.Millisecond, time.Second)
	e, c, infos, rs, rec := su.e, su.c, su.infos, su.rs, su.rec
	ctx := context.Background()
	waitFor(t, outcomeWait, "a blocked handler", func() bool { return su.blocked.Load() == 1 })
	waitFor(t, outcomeWait, "tasks claimed ahead given back", func() bool { return rs.unstarted.Load() > 0 })
	su.open()
	waitFor(t, outcomeWait, "every result recorded", func() bool {
		st, err := c.inspector().Queue(ctx, "default")
		return err == nil && st.Processed == n && st.Running == 0
	})
	conn := e.admin(t)
	defer conn.Close()
	for i, info := range infos {
		if got := rec.count(info.ID); got != 1 {
			t.Fatalf("task %d ran %d times, want 1", i, got)
		}
		if r := e.record(t, conn, info.ID); r != nil && r.Recoveries != 0 {
			t.Errorf("task %d: %d recoveries, want none", i, r.Recoveries)
		}
	}
	t.Logf("given back unstarted %d", rs.unstarted.Load())
}

// When every slot is taken by a run that does not end, the worker stops
// claiming ahead, however quick the runs that ended were: the tasks it
// claimed ahead go back past half of LeaseGrace, and are not claimed
// again while the slots stay stuck (another worker can start them).
func TestPrefetchStopsWhileSlotsAreStuck(t *testing.T) {
	t.Parallel()
	const n, slots = 200, 2
	su := newStuckSetup(t, n, slots, 16, 400*time.Millisecond, 150*time.Millisecond)
	e, w, rs := su.e, su.w, su.rs
	waitFor(t, outcomeWait, "both slots blocked", func() bool { return su.blocked.Load() == slots })
	// Those claimed ahead before the slots were seen stuck go back once
	// they waited half the grace (200 ms): then only the stuck runs are
	// claimed.
	waitFor(t, outcomeWait, "only the stuck runs claimed (the tasks claimed ahead given back, and not claimed again)", func() bool {
		q, err := su.queue()
		return err == nil && q.Running == slots && rs.unstarted.Load() > 0
	})
	back := rs.unstarted.Load()
	// real time: nothing more is given back over three more halves of the
	// grace, a duration on the worker's clock (an absence of events).
	time.Sleep(3 * e.cfg.Advanced.LeaseGrace / 2)
	q, err := su.queue()
	if err != nil {
		t.Fatal(err)
	}
	if u := rs.unstarted.Load(); u != back {
		t.Errorf("given back unstarted: %d, then %d: the worker claimed ahead again while every slot was stuck", back, u)
	}
	if w.proc.waiting.Load() != 0 || q.Running != slots {
		t.Errorf("%d tasks waiting for a slot, queue %+v: want none waiting and %d running", w.proc.waiting.Load(), q, slots)
	}
	t.Logf("given back unstarted %d, queue %+v", back, q)
}

// A pop that finds every queue empty waits for a wake and then takes no
// more tasks than the fetching loop's bound says it may still start (the
// loop decided how many to ask for before the wait, and its slots may all
// have filled since): none, and it returns no task for the loop to decide
// again; some, and it pops that many.
func TestFetcherBoundAfterWaiting(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	e.cfg.Concurrency, e.cfg.Advanced.ClaimBatch = 2, 16
	// The worker is not run, so it never beats: its fetcher takes tasks
	// only while HeartbeatTTL less an interval since it was made has not
	// passed. An hour, so that a loaded machine's slow test does not
	// outlive it (at the default 30 s a run of the test command did).
	e.cfg.Advanced.HeartbeatTTL = time.Hour
	w, err := newWorker(e.pool, e.cfg, newRecorder(nil))
	if err != nil {
		t.Fatal(err)
	}
	f := w.fetcher
	defer f.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// nextAfterWait calls f.next, and enqueues five tasks once its pop
	// waits (its BLPOP sent).
	nextAfterWait := func(n int, bound func(int) int) (string, []string, bool) {
		type popped struct {
			q   string
			ids []string
			ok  bool
		}
		blpops := e.srv.Census.Count("BLPOP")
		got := make(chan popped, 1)
		go func() {
			q, ids, ok := f.next(ctx, n, bound)
			got <- popped{q, ids, ok}
		}()
		waitFor(t, outcomeWait, "the pop to wait", func() bool { return e.srv.Census.Count("BLPOP") > blpops })
		batch := make([]NewTask, 5)
		for i := range batch {
			batch[i] = NewTask{Type: "t"}
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		p := <-got
		return p.q, p.ids, p.ok
	}
	var asked []int
	none := func(n int) int { asked = append(asked, n); return 0 }
	q, ids, ok := nextAfterWait(16, none)
	if !ok || len(ids) != 0 || q != "" || len(asked) != 1 || asked[0] != 16 {
		t.Fatalf("bound 0 after a wait: next = %q, %v, %v (bound asked %v); want no task", q, ids, ok, asked)
	}
	if k := f.want(); k != 1 {
		t.Errorf("after an empty pop the fetcher asks for %d, want 1", k)
	}
	// The five tasks are there: the next pop takes up to n, unbounded.
	q, ids, ok = f.next(ctx, 3, none)
	if !ok || len(ids) != 3 || q != "default" || len(asked) != 1 {
		t.Fatalf("the pop after the wait: %q, %v, %v; want three tasks of default, no bound asked", q, ids, ok)
	}
	f.next(ctx, 2, none) // empties the queue
	two := func(n int) int { return min(n, 2) }
	q, ids, ok = nextAfterWait(16, two)
	if !ok || len(ids) != 2 || q != "default" {
		t.Fatalf("bound 2 after a wait: %q, %v, %v; want two tasks of default", q, ids, ok)
	}
}

// A run claimed ahead that finds no slot gives back, in one Requeue and in
// claim order, itself and every run of its batch claimed after it (they
// wait for its turn, so none started): at a stop, and past half of
// LeaseGrace, one round trip a batch, and the batch keeps its order at the
// front of its queue. A run that had its slot is not given back.
func TestStartRunGivesBackTheRestOfItsBatch(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.Concurrency, e.cfg.Advanced.ClaimBatch = 1, 8
	e.cfg.Advanced.LeaseGrace = 400 * time.Millisecond
	w, err := newWorker(e.pool, e.cfg, newRecorder(nil))
	if err != nil {
		t.Fatal(err)
	}
	rs := countRequeues(w)
	p := w.proc
	grace := e.cfg.Advanced.LeaseGrace.Milliseconds()
	// chain starts n runs of one batch, claimed now, as batchOnce orders
	// them, and returns what each startRun answered once all have.
	chain := func(fetchCtx context.Context, n int) ([]string, []bool) {
		recs := make([]*buckets.Record, n)
		for i := range recs {
			// claimedAt = Deadline - TimeoutMs - grace (fetcher.leaseDeadline)
			recs[i] = &buckets.Record{ID: fmt.Sprintf("run-%d-%d", n, i), Queue: "default", TimeoutMs: 1000, Deadline: ms(time.Now()) + 1000 + grace}
		}
		order := newClaimOrder(recs)
		started := make([]bool, n)
		var wg sync.WaitGroup
		var turn chan struct{}
		for i, rec := range recs {
			next := make(chan struct{})
			c := claimed{rec: rec, turn: turn, next: next, order: order, idx: i}
			turn = next
			wg.Add(1)
			go func() {
				defer wg.Done()
				started[i] = p.startRun(fetchCtx, c)
			}()
		}
		wg.Wait()
		return order.ids, started
	}
	check := func(name string, calls [][]string, want []string) {
		t.Helper()
		if len(calls) != 1 || !slices.Equal(calls[0], want) {
			t.Errorf("%s: given back in %d Requeues %v, want one of %v", name, len(calls), calls, want)
		}
	}

	// A stop: every slot taken, the fetching loop stopped while the runs wait.
	if !p.slots.tryTake() {
		t.Fatal("the slot is not free")
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	ids, started := chain(ctx, 5)
	if slices.Contains(started, true) {
		t.Errorf("stop: runs started %v, want none", started)
	}
	check("stop", rs.takeCalls(), ids)

	// The first run has the free slot; the two after it go back together.
	p.slots.give(1)
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	ids, started = chain(ctx, 3)
	if !slices.Equal(started, []bool{true, false, false}) {
		t.Errorf("one slot free: runs started %v, want only the first", started)
	}
	check("one slot free", rs.takeCalls(), ids[1:])

	// Half of LeaseGrace waited with the fetching loop going on: the slot
	// is still taken by the first chain's run.
	begin := time.Now()
	ids, started = chain(context.Background(), 4)
	if slices.Contains(started, true) {
		t.Errorf("half the grace: runs started %v, want none", started)
	}
	if waited := time.Since(begin); waited < e.cfg.Advanced.LeaseGrace/2-10*time.Millisecond {
		t.Errorf("given back after %v, before half of LeaseGrace (%v)", waited, e.cfg.Advanced.LeaseGrace/2)
	}
	check("half the grace", rs.takeCalls(), ids)
	if n := p.waiting.Load(); n != 0 {
		t.Errorf("%d runs still counted waiting", n)
	}
}
