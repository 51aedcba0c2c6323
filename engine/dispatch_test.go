package engine

import (
	"context"
	"errors"
	"fmt"
	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/bucketq/bucketq/txn"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/google/uuid"
)

// scheduleMany writes n tasks due over spread after base, in batches, on a
// producer clock set before base, and returns their ids.
func scheduleMany(t testing.TB, e *env, n int, base time.Time, spread time.Duration, queues ...string) map[string]bool {
	t.Helper()
	if len(queues) == 0 {
		queues = []string{"default"}
	}
	cfg := e.cfg
	cfg.Advanced.Clock = clocktest.Offset(time.Until(base.Add(-time.Hour)))
	c, err := newLaneClient(e.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	ctx := context.Background()
	batch := make([]NewTask, 0, 1000)
	flush := func() {
		got, err := idsOf(c.EnqueueBatch(ctx, batch))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range got {
			ids[id] = true
		}
		batch = batch[:0]
	}
	for i := 0; i < n; i++ {
		at := base
		if spread > 0 {
			at = base.Add(time.Duration(int64(spread) * int64(i) / int64(n)))
		}
		batch = append(batch, NewTask{Type: "t", Options: []Option{At(at), Queue(queues[i%len(queues)])}})
		if len(batch) == cap(batch) {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
	return ids
}

// A bucket that producers keep pushing into while dispatchers move it
// loses nothing and duplicates nothing.
func TestMoveWhileEnqueueing(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		due := time.Now().Add(-time.Minute).UnixMilli() // due for the dispatchers
		var (
			mu   sync.Mutex
			want = map[string]bool{}
		)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for p := 0; p < 3; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn := e.pool.Get()
				defer conn.Close()
				for i := 0; i < 300; i++ {
					// A producer whose clock is far behind: the task is
					// due, yet it goes into its (due) bucket.
					r := &buckets.Record{ID: uuid.NewString(), Queue: "default", Type: "t", State: buckets.StateWaiting,
						MaxAttempts: 1, TimeoutMs: 1000, Due: due + int64(i%3)}
					if err := st.Enqueue(ctx, conn, 0, []*buckets.Record{r}); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					want[r.ID] = true
					mu.Unlock()
				}
			}()
		}
		for m := 0; m < 3; m++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn := e.pool.Get()
				defer conn.Close()
				for {
					select {
					case <-stop:
						return
					default:
					}
					ms, err := st.DueBuckets(context.Background(), conn, time.Now().UnixMilli(), 8)
					if err != nil {
						t.Error(err)
						return
					}
					if len(ms) > 0 {
						// A move that keeps meeting producers gives up
						// with ErrConflict and is tried again, as the
						// dispatcher does on its next round.
						if _, err := st.Move(ctx, conn, ms, 5); err != nil && !errors.Is(err, txn.ErrConflict) {
							t.Error(err)
							return
						}
					}
				}
			}()
		}
		waitFor(t, outcomeWait, "producers", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(want) == 900
		})
		waitFor(t, outcomeWait, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
		close(stop)
		wg.Wait()
		exactlyOnce(t, e.readyIDs(t, "default"), want)
	})
}

// Eight dispatchers over 100k tasks (bursts and one-task buckets) put each
// task in a ready list exactly once.
func TestConcurrentDispatchersExactlyOnce(t *testing.T) {
	t.Parallel()
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	e := realEnv(t)
	e.cfg.Advanced.Resolution = time.Millisecond
	base := time.Now().Add(time.Hour)
	want := scheduleMany(t, e, n/2, base, 0, "a", "b")                   // two bursts
	for id := range scheduleMany(t, e, n/2, base, 20*time.Second, "a") { // one task per bucket
		want[id] = true
	}
	e.cfg.Advanced.Clock = clocktest.Offset(2 * time.Hour)
	var moved atomic.Int64
	var ds []*dispatcher
	var stops []func()
	for i := 0; i < 8; i++ {
		d, err := newDispatcher(e.pool, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
		stops = append(stops, runBackground(t, d.Run))
	}
	waitFor(t, 2*time.Minute, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
	for _, stop := range stops {
		stop()
	}
	for _, d := range ds {
		moved.Add(d.Moved())
	}
	if moved.Load() != int64(n) {
		t.Errorf("dispatchers report %d moved, want %d", moved.Load(), n)
	}
	ready := append(e.readyIDs(t, "a"), e.readyIDs(t, "b")...)
	exactlyOnce(t, ready, want)
	st, err := e.client(t).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range st {
		if q.Scheduled != 0 {
			t.Errorf("queue %s: scheduled gauge %d after everything moved", q.Queue, q.Scheduled)
		}
	}
}

// Cancel racing the dispatchers: a task whose Cancel returned nil is in no
// ready list; every other task is in one exactly once.
func TestCancelRacesDispatch(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		e.cfg.Advanced.Resolution = time.Millisecond
		base := time.Now().Add(300 * time.Millisecond)
		all := scheduleMany(t, e, 2000, base, 400*time.Millisecond)
		c := e.client(t)
		for i := 0; i < 2; i++ {
			d, err := newDispatcher(e.pool, e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			runBackground(t, d.Run)
		}
		cancelled := map[string]bool{}
		i := 0
		for id := range all {
			i++
			if i%2 == 0 {
				continue
			}
			err := c.Cancel(context.Background(), id)
			switch {
			case err == nil:
				cancelled[id] = true
			case errors.Is(err, ErrAlreadyRunning), errors.Is(err, ErrAlreadyDone):
				t.Fatalf("cancel of a waiting task: %v", err)
			default:
				t.Fatal(err)
			}
		}
		waitFor(t, outcomeWait, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
		want := map[string]bool{}
		for id := range all {
			if !cancelled[id] {
				want[id] = true
			}
		}
		exactlyOnce(t, e.readyIDs(t, "default"), want)
		for id := range cancelled {
			info, err := c.Lookup(context.Background(), id)
			if err != nil || info.State != StateCancelled {
				t.Fatalf("cancelled task %s: %v %v", id, info, err)
			}
			if err := c.Cancel(context.Background(), id); !errors.Is(err, ErrAlreadyDone) {
				t.Fatalf("second cancel: %v, want ErrAlreadyDone", err)
			}
		}
		st, _ := c.Stats(context.Background())
		if len(st) != 1 || st[0].Scheduled != 0 || st[0].Cancelled != int64(len(cancelled)) || st[0].Ready != int64(len(want)) {
			t.Fatalf("stats %+v; want scheduled 0, cancelled %d, ready %d", st, len(cancelled), len(want))
		}
	})
}

// A dispatcher that dies between any two of its commands (or whose EXEC
// reply is lost) loses nothing: the next dispatcher moves everything once.
func TestDispatcherKilledBetweenCommands(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		for limit := 1; limit <= 16; limit++ {
			for _, lose := range []bool{false, true} {
				q := fmt.Sprintf("q%d%v", limit, lose)
				want := scheduleMany(t, e, 30, time.Now().Add(-time.Minute), 30*time.Millisecond, q)
				conn := e.pool.Get()
				fc := &faultConn{Conn: conn, limit: limit, loseReply: lose}
				ms, err := st.DueBuckets(context.Background(), fc, time.Now().UnixMilli(), 100)
				if err == nil {
					_, err = st.Move(ctx, fc, ms, 10)
				}
				conn.Close()
				if err != nil && !fc.tripped() {
					t.Fatalf("limit %d: %v", limit, err)
				}
				// A fresh dispatcher finishes the job.
				conn = e.pool.Get()
				for {
					ms, err := st.DueBuckets(context.Background(), conn, time.Now().UnixMilli(), 100)
					if err != nil {
						t.Fatal(err)
					}
					if len(ms) == 0 {
						break
					}
					if _, err := st.Move(ctx, conn, ms, 10); err != nil {
						t.Fatal(err)
					}
				}
				conn.Close()
				exactlyOnce(t, e.readyIDs(t, q), want)
			}
		}
	})
}

// The pipelined two-lane mover cut after any number of commands on either
// lane (EXEC reply lost or not) loses and duplicates nothing.
func TestMoveDueKilledBetweenCommands(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		for limit := 1; limit <= 40; limit += 3 {
			for _, lose := range []bool{false, true} {
				q := fmt.Sprintf("q%d%v", limit, lose)
				want := scheduleMany(t, e, 40, time.Now().Add(-time.Minute), 40*time.Millisecond, q)
				c1, c2 := e.pool.Get(), e.pool.Get()
				f1 := &faultConn{Conn: c1, limit: limit, loseReply: lose}
				f2 := &faultConn{Conn: c2, limit: limit + 2, loseReply: !lose}
				_, err := st.MoveDue(ctx, []redisConn{f1, f2}, buckets.MoveOpts{Now: time.Now().UnixMilli(), Chunk: 4, MaxTasks: 100, Lookahead: 16, Window: limit % 3})
				c1.Close()
				c2.Close()
				if err != nil && !f1.tripped() && !f2.tripped() {
					t.Fatalf("limit %d: %v", limit, err)
				}
				conn := e.pool.Get()
				for i := 0; ; i++ {
					res, err := st.MoveDue(ctx, []redisConn{conn}, buckets.MoveOpts{Now: time.Now().UnixMilli(), Chunk: 4, MaxTasks: 100, Lookahead: 16, Window: i % 2})
					if err != nil {
						t.Fatal(err)
					}
					if res.Tasks+res.Stale+res.Conflicts == 0 && !res.Partial {
						break
					}
					if i > 100 {
						t.Fatal("mover does not finish")
					}
				}
				conn.Close()
				exactlyOnce(t, e.readyIDs(t, q), want)
			}
		}
	})
}

// TestDispatchWindows: a dispatcher reads the earliest due buckets until
// conflicts over a backlog deeper than one window spread its reads over
// more windows (up to maxWindows), and shrinks them again where the
// backlog ends.
func TestDispatchWindows(t *testing.T) {
	t.Parallel()
	d := &dispatcher{}
	step := func(asked int, res buckets.MoveResult, want int) {
		t.Helper()
		d.spread(asked, res)
		if d.windows != want {
			t.Fatalf("after asking for window %d and finding %+v: %d windows, want %d", asked, res, d.windows, want)
		}
	}
	full := buckets.MoveResult{WindowFull: true, Tasks: 1024}
	step(0, full, 0)                             // no conflict: the earliest, as a lone dispatcher
	step(0, buckets.MoveResult{Conflicts: 1}, 1) // conflicts over a window not full: nothing to spread over
	step(0, buckets.MoveResult{WindowFull: true, Conflicts: 2}, 2)
	for _, want := range []int{4, 8, 16, 16} {
		step(1, buckets.MoveResult{Window: 1, WindowFull: true, Conflicts: 1}, want)
	}
	step(5, buckets.MoveResult{Window: 5, WindowFull: true}, 16) // no conflict: kept
	step(9, buckets.MoveResult{Window: 0, WindowFull: true}, 9)  // window 9 was empty
	step(6, buckets.MoveResult{Window: 6}, 7)                    // window 6 is the last
	step(0, buckets.MoveResult{}, 1)                             // the backlog is within one window
}
