package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
	"github.com/jonboulle/clockwork"
)

// conflictMover reports a round that met only conflicts, n times, and
// counts the rounds.
type conflictMover struct {
	n      int
	rounds []time.Time
	done   chan struct{}
}

func (m *conflictMover) MoveDue(ctx context.Context, conns []redis.Conn, o buckets.MoveOpts) (buckets.MoveResult, error) {
	m.rounds = append(m.rounds, time.Now())
	if len(m.rounds) <= m.n {
		return buckets.MoveResult{Conflicts: 1}, nil
	}
	if len(m.rounds) == m.n+1 {
		close(m.done)
	}
	return buckets.MoveResult{}, nil
}

func (m *conflictMover) NextDue(context.Context, redis.Conn) (int64, bool, error) {
	return 0, false, nil
}

func (m *conflictMover) SettleMove(context.Context, redis.Conn, buckets.UncertainMove) (buckets.SettleResult, error) {
	return buckets.SettleResult{}, nil
}

// A dispatcher round that met only conflicts backs off before the next:
// the pauses grow as the conflicts go on, instead of reading again at once.
func TestDispatcherBacksOffAfterConflicts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &conflictMover{n: 5, done: make(chan struct{})}
	d.moves = m
	stop := runBackground(t, d.Run)
	select {
	case <-m.done:
	case <-time.After(outcomeWait):
		t.Fatal("the dispatcher did not get past the conflicts")
	}
	stop()
	// Pauses after the 2nd, 3rd and 4th conflicted rounds: each at least
	// the backoff's floor, half its nominal 50, 100, 200 ms.
	for i, floor := range []time.Duration{25, 50, 100} {
		gap := m.rounds[i+2].Sub(m.rounds[i+1])
		if gap < floor*time.Millisecond {
			t.Fatalf("round %d came %v after a conflicted round; want a pause of at least %v", i+3, gap, floor*time.Millisecond)
		}
	}
}

// The retry policy: done on nil, Snooze waits without using an attempt
// and is counted apart up to MaxSnoozes, failures retry until MaxAttempts, permanent errors and unknown
// types (under "dead") go to the dead letters.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	p := retryPolicy{cfg: Config{RetryDelay: func(*Task, int, error) time.Duration { return time.Second }, UnknownType: "dead",
		Advanced: AdvancedConfig{MaxSnoozes: 2}}}
	now := time.UnixMilli(1_000_000)
	rec := func() *buckets.Record { return &buckets.Record{MaxAttempts: 2} }
	if out := p.decide(rec(), now, nil); out != buckets.Done {
		t.Fatalf("nil: %v", out)
	}
	r := rec()
	for i := 1; i <= 2; i++ {
		if out := p.decide(r, now, Snooze(5*time.Second)); out != buckets.Again || r.Attempts != 0 || r.Snoozes != i || r.State != buckets.StateWaiting || r.Due != now.Add(5*time.Second).UnixMilli() {
			t.Fatalf("snooze %d: %v %+v", i, out, r)
		}
	}
	if out := p.decide(r, now, Snooze(5*time.Second)); out != buckets.Bury || r.Attempts != 0 || r.Snoozes != 2 || !strings.Contains(r.LastError, "snoozed too often") {
		t.Fatalf("snooze past MaxSnoozes: %v %+v", out, r)
	}
	p.cfg.Advanced.MaxSnoozes = -1
	if out := p.decide(rec(), now, Snooze(time.Second)); out != buckets.Bury {
		t.Fatalf("snooze with MaxSnoozes -1: %v", out)
	}
	p.cfg.Advanced.MaxSnoozes = 2
	r = rec()
	if out := p.decide(r, now, errors.New("x")); out != buckets.Again || r.Attempts != 1 || r.State != buckets.StateRetry || r.Due != now.Add(time.Second).UnixMilli() {
		t.Fatalf("first failure: %v %+v", out, r)
	}
	if out := p.decide(r, now, errors.New("x")); out != buckets.Bury || r.Attempts != 2 {
		t.Fatalf("last failure: %v %+v", out, r)
	}
	if out := p.decide(rec(), now, Permanent(errors.New("x"))); out != buckets.Bury {
		t.Fatalf("permanent: %v", out)
	}
	if out := p.decide(rec(), now, ErrNoHandler); out != buckets.Bury {
		t.Fatalf("no handler: %v", out)
	}
}

// The in-flight set holds popped ids until their claim ends, counts an id
// popped twice, and marks the list for recovery when a pop reply is lost
// or a claim gives its id back.
func TestInflightSet(t *testing.T) {
	t.Parallel()
	s := newInflightSet()
	for i := 0; i < 2; i++ {
		if id, _ := s.pop(func() (string, bool, error) { return "a", false, nil }); id != "a" {
			t.Fatal(id)
		}
	}
	if got := s.snapshot(); got["a"] != 2 {
		t.Fatalf("snapshot %v", got)
	}
	s.release("a", false)
	if got := s.snapshot(); got["a"] != 1 || s.dirty.Load() {
		t.Fatalf("after release: %v dirty %v", got, s.dirty.Load())
	}
	s.release("a", true)
	if got := s.snapshot(); len(got) != 0 || !s.dirty.Load() {
		t.Fatalf("after give-back: %v dirty %v", got, s.dirty.Load())
	}
	s.dirty.Store(false)
	_, err := s.pop(func() (string, bool, error) { return "", true, errInjected })
	if !errors.Is(err, errInjected) || !s.dirty.Load() {
		t.Fatalf("lost pop: %v dirty %v", err, s.dirty.Load())
	}
	select {
	case <-s.wake:
	default:
		t.Fatal("the recoverer was not woken")
	}
}

// Task.Run numbers the starts of a task: a handler can tell a re-run.
func TestTaskRunNumber(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	runs := make(chan int, 4)
	mux := NewMux()
	mux.HandleFunc("t", func(ctx context.Context, task *Task) error {
		runs <- task.Run
		if task.Run == 1 {
			return errors.New("first run fails")
		}
		return nil
	})
	w, _ := newWorker(e.pool, e.cfg, mux)
	runBackground(t, w.Run)
	if _, err := e.client(t).Enqueue(context.Background(), "t", nil, MaxAttempts(3)); err != nil {
		t.Fatal(err)
	}
	d, _ := newDispatcher(e.pool, e.cfg)
	runBackground(t, d.Run)
	for want := 1; want <= 2; want++ {
		select {
		case got := <-runs:
			if got != want {
				t.Fatalf("run %d, want %d", got, want)
			}
		case <-time.After(outcomeWait):
			t.Fatalf("run %d did not happen", want)
		}
	}
}

// Garbage members of the bucket index are removed with a log line, and
// the line is rate-limited.
func TestGarbageIndexMembersLogged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	logs := &logLines{}
	e.cfg.Logger = slog.New(logs)
	admin := e.admin(t)
	for _, m := range []string{"garbage", "q:notanumber"} {
		if _, err := admin.Do("ZADD", e.key("sched"), 1, m); err != nil {
			t.Fatal(err)
		}
	}
	d, _ := newDispatcher(e.pool, e.cfg)
	runBackground(t, d.Run)
	waitFor(t, outcomeWait, "the index emptied", func() bool {
		n, _ := redis.Int(admin.Do("ZCARD", e.key("sched")))
		return n == 0
	})
	if _, err := admin.Do("ZADD", e.key("sched"), 1, "more-garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("LPUSH", e.key("wake"), "1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the second member removed", func() bool {
		n, _ := redis.Int(admin.Do("ZCARD", e.key("sched")))
		return n == 0
	})
	logs.mu.Lock()
	defer logs.mu.Unlock()
	n := 0
	for _, l := range logs.lines {
		if strings.Contains(l, "index members that name no bucket removed") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d log lines about garbage members, want 1 (rate-limited): %q", n, logs.lines)
	}
}

// The heartbeater lets the worker take tasks only while the last beat that
// succeeded is recent enough for the key to exist.
func TestHeartbeaterAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	w, _ := newWorker(e.pool, e.cfg, NewMux())
	// The TTL reckoning on a clock the test drives: on a busy machine a
	// beat's round trip alone can outlast TTL less an interval (800 ms).
	beats := clockwork.NewFakeClock()
	w.hb.beats, w.hb.born = beats, beats.Now()
	if err := w.hb.beat(context.Background()); err != nil || !w.hb.alive() {
		t.Fatalf("after a beat: alive %v, err %v", w.hb.alive(), err)
	}
	// The last successful beat was sent TTL ago.
	w.hb.born = w.hb.born.Add(-e.cfg.Advanced.HeartbeatTTL)
	if w.hb.alive() {
		t.Fatal("alive a TTL after the last beat")
	}
}

// failingRequeue fails every Requeue, counting them.
type failingRequeue struct {
	store
	n atomic.Int32
}

func (f *failingRequeue) Requeue(context.Context, *lane, []string, buckets.Reason) (buckets.RequeueResult, error) {
	f.n.Add(1)
	return buckets.RequeueResult{}, errInjected
}

// The requeuer retries a failing return a bounded number of times, then
// reports the error and leaves the tasks to a reaper.
func TestRequeuerGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	w, _ := newWorker(e.pool, e.cfg, NewMux())
	fs := &failingRequeue{store: w.store}
	w.setStore(fs)
	err := w.requeuer.requeue([]string{"a"}, buckets.Shutdown)
	if !errors.Is(err, errInjected) {
		t.Fatalf("requeue: %v, want the store's error", err)
	}
	if n := fs.n.Load(); n != cleanupTries {
		t.Fatalf("%d tries, want %d", n, cleanupTries)
	}
}
