package engine

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/gomodule/redigo/redis"
)

func commandTotal(e *env) int {
	n := 0
	for _, c := range e.srv.Census.Commands() {
		n += e.srv.Census.Count(c)
	}
	return n
}

// An idle server (dispatcher, reaper, worker with 16 slots on three
// queues) sends a bounded number of commands per IdleWait and heartbeat:
// nothing polls. With the one-second settings used here the budget is
// about 6 per IdleWait (the waiter's BLPOP and one fetch round of 3
// queues; the dispatcher's BLPOP and index read), 1 per heartbeat (4 for
// a full one, every HeartbeatTTL) and 3 per reap; with the defaults (20
// s, 10 s, 30 s) that is under one command a second (docs/design.md, "What
// an idle process sends"). docs/benchmarks.md has the figures measured
// with defaults.
func TestIdleCost(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := privateEnv(t)
	e.cfg.Advanced.IdleWait = time.Second
	e.cfg.Advanced.HeartbeatInterval = time.Second
	e.cfg.Advanced.HeartbeatTTL = 3 * time.Second
	e.cfg.Advanced.ReapInterval = time.Second
	e.cfg.Concurrency = 16
	e.cfg.Queues = []QueueConfig{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	srv, err := newLaneServer(e.pool, e.cfg, NewMux(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	stopIdle := runBackground(t, srv.Run)
	// Started up once the worker's waiter and the dispatcher block.
	waitFor(t, outcomeWait, "the idle BLPOPs", func() bool { return e.srv.Census.Count("BLPOP") >= 2 })
	before := commandTotal(e)
	const window = 5 * time.Second
	// real time: the budget is commands per second of idleness.
	time.Sleep(window)
	perSec := float64(commandTotal(e)-before) / window.Seconds()
	t.Logf("idle: %.1f commands/s with 1 s IdleWait, heartbeat and reap interval", perSec)
	// About 6 + 2 + 3 a second; the budget leaves room
	// for timers that fire together in the window. A poll would send
	// thousands.
	if perSec > 20 {
		t.Fatalf("idle server sent %.1f commands/s; budget 20", perSec)
	}
	stopIdle()

	// And an idle worker starts a new task at once: woken by the enqueue's
	// token, not by its idle timeout. IdleWait is 10 s here and the task
	// must start within wakeBound (a few round trips, with room for a
	// loaded machine): a worker that polled, or slept its IdleWait, fails.
	const wakeBound = time.Second
	e.cfg.Advanced.IdleWait = 10 * time.Second
	c := e.client(t)
	ran := make(chan time.Time, 1)
	mux := NewMux()
	mux.HandleFunc("t", func(ctx context.Context, task *Task) error { ran <- time.Now(); return nil })
	w, err := newWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	blpops := e.srv.Census.Count("BLPOP")
	runBackground(t, w.Run)
	// The worker is idle once its waiter has sent its BLPOP and the slots
	// found nothing (their fetch round comes first).
	waitFor(t, outcomeWait, "the idle worker's BLPOP", func() bool { return e.srv.Census.Count("BLPOP") > blpops })
	t0 := time.Now()
	if _, err := c.Enqueue(context.Background(), "t", nil, Queue("c")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ran:
		d := at.Sub(t0)
		t.Logf("idle worker started a new task after %v (IdleWait %v)", d, e.cfg.Advanced.IdleWait)
		if d > wakeBound {
			t.Fatalf("an idle worker started a new task after %v; the wake-up path should take under %v (IdleWait %v)", d, wakeBound, e.cfg.Advanced.IdleWait)
		}
	case <-time.After(e.cfg.Advanced.IdleWait + 2*time.Second):
		t.Fatalf("an idle worker did not start a new task within IdleWait %v", e.cfg.Advanced.IdleWait)
	}
}

// An idle worker's recoverer looks at its in-flight list once at start
// and then only after a pop: an id that entered the list with no pop (put
// there by hand, as a lost pop reply would leave it) waits for the next
// pop, and the first heartbeat tick after that pop returns it.
func TestRecovererLooksAfterPops(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	ctx := context.Background()
	admin := e.admin(t)
	e.cfg.Advanced.HeartbeatInterval = 100 * time.Millisecond
	e.cfg.Advanced.HeartbeatTTL = 2 * time.Second
	rec := newRecorder(nil)
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	lranges := func() int { return e.srv.Census.Count("LRANGE") }
	setexes := func() int { return e.srv.Census.Count("SETEX") }
	base := lranges()
	runBackground(t, w.Run)
	waitFor(t, outcomeWait, "the recoverer's first look", func() bool { return lranges() > base })
	// Ten heartbeat intervals with nothing popped: no look.
	looks, beats := lranges(), setexes()
	waitFor(t, outcomeWait, "ten heartbeats", func() bool { return setexes() >= beats+10 })
	if n := lranges() - looks; n != 0 {
		t.Fatalf("an idle recoverer looked %d times in ten heartbeat intervals with nothing popped", n)
	}

	// A task of a queue the worker does not serve, put in its in-flight
	// list by hand: no slot holds it.
	c := e.client(t)
	stray, err := idOf(c.Enqueue(ctx, "t", nil, Queue("other")))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := redis.String(admin.Do("RPOPLPUSH", e.key("q:other"), e.key("f:"+w.ID()))); err != nil || got != stray {
		t.Fatal(got, err)
	}
	// A pop: the next tick looks, and returns the stray id to its queue.
	id, err := idOf(c.Enqueue(ctx, "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the popped task to run", func() bool { return rec.count(id) == 1 })
	waitFor(t, outcomeWait, "the stray id back in its ready list", func() bool {
		n, err := redis.Int(admin.Do("LLEN", e.key("f:"+w.ID())))
		if err != nil {
			t.Fatal(err)
		}
		ready, err := redis.Strings(admin.Do("LRANGE", e.key("q:other"), 0, -1))
		if err != nil {
			t.Fatal(err)
		}
		return n == 0 && len(ready) == 1 && ready[0] == stray
	})
}

// beatLog records the heartbeat calls of a worker in order; the first
// Refresh after arm is set sleeps for slow, or fails.
type beatLog struct {
	store
	mu    sync.Mutex
	calls []string
	slow  time.Duration
	fail  bool
	arm   atomic.Bool
}

func (b *beatLog) log(s string) {
	b.mu.Lock()
	b.calls = append(b.calls, s)
	b.mu.Unlock()
}

func (b *beatLog) seq() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

func (b *beatLog) Beat(ctx context.Context, l *lane, bt beat) error {
	if bt.full {
		b.log("beat")
		return b.store.Beat(ctx, l, bt)
	}
	if b.arm.CompareAndSwap(true, false) {
		if b.fail {
			b.log("refresh-failed")
			return errInjected
		}
		err := b.store.Beat(ctx, l, bt)
		// real time: the reply comes late, past the heartbeat's TTL, which
		// the worker measures on its own clock.
		time.Sleep(b.slow)
		b.log("refresh-slow")
		return err
	}
	b.log("refresh")
	return b.store.Beat(ctx, l, bt)
}

// A worker's heartbeat renews its keys between full beats (which also
// register it and clear its types from the unserved hashes): a full beat
// comes first, at least once per HeartbeatTTL, after a failed beat, and at
// once after a renewal whose reply came so late that the key may have
// expired before it ran, before the worker counts itself alive again.
func TestHeartbeatFullBeats(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	for _, tc := range []struct {
		name string
		fail bool
		want string
	}{{"late renewal", false, "refresh-slow"}, {"failed renewal", true, "refresh-failed"}} {
		t.Run(tc.name, func(t *testing.T) {
			// The two cases run together, and with no other test: each
			// bounds a real time.
			t.Parallel()
			e := realEnv(t)
			admin := e.admin(t)
			e.cfg.Advanced.HeartbeatInterval = 100 * time.Millisecond
			e.cfg.Advanced.HeartbeatTTL = 2 * time.Second
			mux := NewMux()
			mux.HandleFunc("t", func(context.Context, *Task) error { return nil })
			w, err := newWorker(e.pool, e.cfg, mux)
			if err != nil {
				t.Fatal(err)
			}
			bl := &beatLog{store: w.store, slow: e.cfg.Advanced.HeartbeatTTL, fail: tc.fail}
			w.setStore(bl)
			runBackground(t, w.Run)
			waitFor(t, outcomeWait, "renewals", func() bool { return len(bl.seq()) >= 5 })
			if s := bl.seq(); s[0] != "beat" || !slices.Contains(s, "refresh") {
				t.Fatalf("heartbeat calls %v: want a full beat first, then renewals", s)
			}
			// Put the registry and the unserved hash out of step by hand:
			// a full beat puts them right within HeartbeatTTL.
			if _, err := admin.Do("SREM", e.key("w"), w.ID()); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Do("HSET", e.key("un:default"), "t", 1); err != nil {
				t.Fatal(err)
			}
			at := time.Now()
			waitFor(t, 2*e.cfg.Advanced.HeartbeatTTL, "a full beat", func() bool {
				in, err := redis.Bool(admin.Do("SISMEMBER", e.key("w"), w.ID()))
				if err != nil {
					t.Fatal(err)
				}
				un, err := redis.Bool(admin.Do("HEXISTS", e.key("un:default"), "t"))
				if err != nil {
					t.Fatal(err)
				}
				return in && !un
			})
			if d := time.Since(at); d > e.cfg.Advanced.HeartbeatTTL+time.Second {
				t.Fatalf("registry put right after %v; bound %v", d, e.cfg.Advanced.HeartbeatTTL)
			}
			n := len(bl.seq())
			bl.arm.Store(true)
			waitFor(t, outcomeWait, "the armed renewal and the beat after it", func() bool {
				s := bl.seq()
				i := slices.Index(s[n:], tc.want)
				return i >= 0 && n+i+1 < len(s)
			})
			s := bl.seq()
			i := n + slices.Index(s[n:], tc.want)
			if s[i+1] != "beat" {
				t.Fatalf("heartbeat calls %v: after %s want a full beat", s[n:], tc.want)
			}
		})
	}
}

// A resume whose control message was lost (the paused set changed by
// hand) takes effect within one IdleWait: a worker that knows one of its
// queues paused re-reads the set when its wait times out. A pause whose
// message was lost takes effect at the first claim, which reads the
// paused set under WATCH and tells the worker.
func TestLostPauseAndResume(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := realEnv(t)
	ctx := context.Background()
	admin := e.admin(t)
	e.cfg.Advanced.IdleWait = time.Second
	rec := newRecorder(nil)
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
	c := e.client(t)
	first, err := idOf(c.Enqueue(ctx, "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the first task", func() bool { return rec.count(first) == 1 })
	// Lost pause: the set says paused, no message went out.
	if _, err := admin.Do("SADD", e.key("paused"), "default"); err != nil {
		t.Fatal(err)
	}
	held, err := idOf(c.Enqueue(ctx, "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the worker to learn the pause from a claim", func() bool { return w.control.isPaused("default") })
	if rec.count(held) != 0 {
		t.Fatal("a task of a paused queue ran")
	}
	// Lost resume.
	if _, err := admin.Do("SREM", e.key("paused"), "default"); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	waitFor(t, outcomeWait, "the held task after the lost resume", func() bool { return rec.count(held) == 1 })
	if d := time.Since(at); d > e.cfg.Advanced.IdleWait+time.Second {
		t.Fatalf("resumed after %v; bound IdleWait %v", d, e.cfg.Advanced.IdleWait)
	}
}

// A running reaper trims dead letters past DeadRetention, though not on
// every pass: within trimEvery of their retention.
func TestReaperTrimsDeadLetters(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := realEnv(t)
	ctx := context.Background()
	e.cfg.DeadRetention = time.Second
	rec := newRecorder(func(context.Context, *Task) error { return errInjected })
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
	c := e.client(t)
	if _, err := c.Enqueue(ctx, "t", nil, MaxAttempts(1)); err != nil {
		t.Fatal(err)
	}
	deadCount := func() int64 {
		n, err := e.admin(t).Do("ZCARD", e.key("dead"))
		if err != nil {
			t.Fatal(err)
		}
		return n.(int64)
	}
	waitFor(t, outcomeWait, "a dead letter", func() bool { return deadCount() == 1 })
	at := time.Now()
	r, err := newReaper(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, r.Run)
	bound := e.cfg.DeadRetention + r.trimEvery() + e.cfg.Advanced.ReapInterval*6/5
	waitFor(t, 2*bound+5*time.Second, "the dead letter trimmed", func() bool { return deadCount() == 0 })
	if d := time.Since(at); d > bound+time.Second {
		t.Fatalf("trimmed after %v; bound %v", d, bound)
	}
}

// An idle dispatcher whose wait ran out with no token reads when the
// earliest bucket is due (one ZRANGE) and moves nothing then; a bucket due
// meanwhile that no token announced (here: its time reached by moving the
// dispatcher's clock, which sets no timer) is moved by the look that
// follows the next idle wait.
func TestDispatcherIdleLook(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := privateEnv(t)
	ctx := context.Background()
	base := time.Now()
	clock := clocktest.NewSettable(base)
	e.cfg.Advanced.Clock = clock
	e.cfg.Advanced.IdleWait = time.Second
	c := e.client(t)
	if _, err := c.Enqueue(ctx, "t", nil, At(base.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	blpops := e.srv.Census.Count("BLPOP")
	runBackground(t, d.Run)
	// Two idle waits: each ends in a look of one read, no move.
	waitFor(t, outcomeWait, "three idle waits begun", func() bool { return e.srv.Census.Count("BLPOP") >= blpops+3 })
	reads := e.srv.Census.Count("ZRANGEBYSCORE")
	looks := e.srv.Census.Count("ZRANGE")
	waitFor(t, outcomeWait, "two more idle waits", func() bool { return e.srv.Census.Count("BLPOP") >= blpops+5 })
	// The waker blocks again as soon as a wait ends, while the main loop
	// looks: the look of the last wait may come just after the next BLPOP.
	waitFor(t, 2*time.Second, "two looks in two idle waits", func() bool { return e.srv.Census.Count("ZRANGE")-looks >= 2 })
	if n := e.srv.Census.Count("ZRANGEBYSCORE") - reads; n != 0 {
		t.Fatalf("idle looks with nothing due read the due buckets %d times", n)
	}
	clock.Set(base.Add(time.Hour + time.Second))
	at := time.Now()
	waitFor(t, 3*e.cfg.Advanced.IdleWait+5*time.Second, "the due task moved", func() bool { return d.Moved() == 1 })
	if el := time.Since(at); el > e.cfg.Advanced.IdleWait+2*time.Second {
		t.Fatalf("moved after %v; bound IdleWait %v (Redis 2.4 may add a second)", el, e.cfg.Advanced.IdleWait)
	}
}
