package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/schedule"
	"github.com/jonboulle/clockwork"
)

// fakeClockEnv is a real server's env on a fake clock, with a Server of
// every role running the handler h, after set changes its Config.
// Nothing but the test moves the clock.
func fakeClockEnv(t *testing.T, h Handler, set ...func(*Config)) (*env, *clockwork.FakeClock) {
	t.Helper()
	e := realEnv(t)
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	e.cfg.Advanced.Clock = clock
	for _, f := range set {
		f(&e.cfg)
	}
	srv, err := newLaneServer(e.pool, e.cfg, h, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	return e, clock
}

// blockUntil waits until n timers or tickers wait on the clock.
func blockUntil(t *testing.T, clock *clockwork.FakeClock, n int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), outcomeWait)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %s on the clock: %v", what, err)
	}
}

// A task due in five minutes is moved when the clock reaches its due
// time, not before, and no real minute passes: the dispatcher's wait for
// the next bucket is a timer on the engine's Clock.
func TestFakeClockDelay(t *testing.T) {
	t.Parallel()
	ran := make(chan *Task, 1)
	e, clock := fakeClockEnv(t, HandlerFunc(func(_ context.Context, task *Task) error {
		ran <- task
		return nil
	}))
	ctx := context.Background()
	id, err := idOf(e.client(t).Enqueue(ctx, "later", nil, In(5*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	due := clock.Now().Add(5 * time.Minute)
	blockUntil(t, clock, 1, "the dispatcher's wait for the bucket")
	clock.Advance(5*time.Minute - time.Second)
	if s := e.state(t, id); s != StateScheduled {
		t.Fatalf("state %v a second before the due time, want scheduled", s)
	}
	clock.Advance(time.Second)
	select {
	case task := <-ran:
		if task.ID != id || task.Due.Before(due) {
			t.Fatalf("ran %s due %v, want %s due %v", task.ID, task.Due, id, due)
		}
	case <-time.After(outcomeWait):
		t.Fatalf("not run once the clock reached its due time (state %v)", e.state(t, id))
	}
}

// A failed run's retry waits its backoff on the engine's Clock.
func TestFakeClockRetry(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	done := make(chan struct{})
	e, clock := fakeClockEnv(t, HandlerFunc(func(context.Context, *Task) error {
		if runs.Add(1) == 1 {
			return errors.New("first run fails")
		}
		close(done)
		return nil
	}), func(c *Config) {
		c.RetryDelay = func(*Task, int, error) time.Duration { return 5 * time.Minute }
	})
	id, err := idOf(e.client(t).Enqueue(context.Background(), "flaky", nil, MaxAttempts(3)))
	if err != nil {
		t.Fatal(err)
	}
	// The first run failed and its retry waits in a bucket.
	waitFor(t, outcomeWait, "the retry scheduled", func() bool { return e.state(t, id) == StateRetrying })
	blockUntil(t, clock, 1, "the dispatcher's wait for the retry")
	if runs.Load() != 1 {
		t.Fatalf("%d runs before the backoff passed on the clock, want 1", runs.Load())
	}
	clock.Advance(5*time.Minute - time.Second)
	if s := e.state(t, id); s != StateRetrying {
		t.Fatalf("state %v a second before the backoff ends, want retrying", s)
	}
	clock.Advance(time.Second)
	select {
	case <-done:
	case <-time.After(outcomeWait):
		t.Fatalf("retry not run once the backoff passed (state %v)", e.state(t, id))
	}
}

// A handler that runs past its timeout and lease is given up on when the
// engine's Clock reaches the lease's end, and its task runs again: the
// lease timer is on the Clock, so the test needs no real minute.
func TestFakeClockLease(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	started := make(chan struct{}, 2)
	var cancelled sync.WaitGroup
	cancelled.Add(1)
	e, clock := fakeClockEnv(t, HandlerFunc(func(ctx context.Context, _ *Task) error {
		n := runs.Add(1)
		started <- struct{}{}
		if n > 1 {
			return nil
		}
		<-ctx.Done() // cancelled when the lease ends on the clock
		cancelled.Done()
		return ctx.Err()
	}))
	id, err := idOf(e.client(t).Enqueue(context.Background(), "stuck", nil, Timeout(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	blockUntil(t, clock, 1, "the run's lease timer")
	if runs.Load() != 1 {
		t.Fatalf("%d runs before the lease ended", runs.Load())
	}
	clock.Advance(time.Minute + e.cfg.Advanced.LeaseGrace)
	cancelled.Wait()
	select {
	case <-started:
	case <-time.After(outcomeWait):
		t.Fatalf("not run again once its lease ended (state %v)", e.state(t, id))
	}
	waitFor(t, outcomeWait, "the second run done", func() bool { return e.state(t, id) == StateDone })
}

// A periodic entry's firing runs when the clock reaches it: the scheduler
// places firings in buckets ahead, and the dispatcher moves them on the
// Clock.
func TestFakeClockPeriodic(t *testing.T) {
	t.Parallel()
	got := make(chan *Task, 10)
	e := realEnv(t)
	// Tomorrow's noon: a firing's record expires at a time on the Clock,
	// so the clock must not be behind the server's.
	y, m, d := time.Now().UTC().AddDate(0, 0, 1).Date()
	noon := time.Date(y, m, d, 12, 0, 0, 0, time.UTC)
	clock := clockwork.NewFakeClockAt(noon.Add(-5 * time.Second))
	e.cfg.Advanced.Clock = clock
	e.logOnFailure(t)
	srv, err := newLaneServer(e.pool, e.cfg, HandlerFunc(func(_ context.Context, task *Task) error {
		got <- task
		return nil
	}), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddPeriodic(Periodic{Name: "noon", Cron: "0 12 * * *", Type: "report"}); err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	blockUntil(t, clock, 1, "the dispatcher's wait for the firing")
	clock.Advance(5 * time.Second)
	select {
	case task := <-got:
		if !task.Due.Equal(noon) || task.Periodic != "noon" {
			t.Fatalf("ran entry %q due %v, want noon due %v", task.Periodic, task.Due.UTC(), noon)
		}
	case <-time.After(outcomeWait):
		t.Fatalf("the firing did not run once the clock reached it (state %v)",
			e.state(t, schedule.FiringID("noon", noon)))
	}
}

// heartbeatStore records beats; it fails them while fail is set.
type heartbeatStore struct {
	store
	mu         sync.Mutex
	full, renw int
	fail       bool
	sent       chan struct{}
}

func (s *heartbeatStore) Beat(_ context.Context, _ *lane, b beat) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() { s.sent <- struct{}{} }()
	if s.fail {
		return errors.New("beat refused")
	}
	if b.full {
		s.full++
	} else {
		s.renw++
	}
	return nil
}

func (s *heartbeatStore) Unplaced() int { return 0 }

func (s *heartbeatStore) counts() (full, renewals int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.full, s.renw
}

// The heartbeater beats once per interval on its clock, renewing between
// full beats, and once beats fail it says the worker is not alive by the
// time the key may expire.
func TestHeartbeaterOnClock(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	st := &heartbeatStore{sent: make(chan struct{}, 100)}
	h := newHeartbeater(heartbeatParams{store: st, ttl: 30 * time.Second, interval: 5 * time.Second,
		clock: clock, beats: clock, queues: []string{"default"}, concurrency: 1, log: discardLog})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := h.register(ctx); err != nil {
		t.Fatal(err)
	}
	<-st.sent
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.run(ctx)
	}()
	for i := 0; i < 3; i++ {
		blockUntil(t, clock, 1, "the heartbeat ticker")
		clock.Advance(5 * time.Second)
		<-st.sent
	}
	if full, renewals := st.counts(); full != 1 || renewals != 3 {
		t.Fatalf("%d full beats and %d renewals after registering and three intervals, want 1 and 3", full, renewals)
	}
	if !h.alive() {
		t.Fatal("not alive right after a beat")
	}
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	for i := 0; i < 5; i++ {
		clock.Advance(5 * time.Second)
		<-st.sent
	}
	// 25 s since the last beat that succeeded: within one interval of
	// the 30 s TTL, so the worker must take no more tasks.
	if h.alive() {
		t.Fatal("alive 25 s after the last beat with a 30 s TTL and a 5 s interval")
	}
	st.mu.Lock()
	st.fail = false
	st.mu.Unlock()
	clock.Advance(5 * time.Second)
	<-st.sent
	if full, _ := st.counts(); full != 2 || !h.alive() {
		t.Fatalf("after beats came back: %d full beats (want 2: the first beat after a failure is full), alive %v", full, h.alive())
	}
	cancel()
	<-done
}
