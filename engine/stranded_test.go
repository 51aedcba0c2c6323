package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// A LIST at a task's record key is set aside and dead-lettered with the
// reason, and does not hold the worker: when the reply of the worker's
// next pop is lost, the good task it took is recovered and runs within a
// few seconds, and no queue is invented for the bad id.
func TestWrongTypeRecordThenLostPop(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	admin := e.admin(t)
	var armed atomic.Bool
	base := e.pool
	e.pool = &redisPool{MaxIdle: 16, Dial: func() (redisConn, error) {
		c, err := base.Dial()
		if err != nil {
			return nil, err
		}
		return &popReplyLoser{redisConn: c, armed: &armed}, nil
	}}
	bad := uuid.NewString()
	if _, err := admin.Do("RPUSH", e.key("t:"+bad), "not", "a", "record"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("LPUSH", e.key("q:default"), bad); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	e.cfg.Concurrency = 2
	// Single pops only: the fault is injected on a RPOPLPUSH sent on its
	// own, and a batch pop (pipelined, after the bad id's pop found all it
	// asked for) would take the good task past it.
	e.cfg.Advanced.ClaimBatch = 1
	w, _ := newWorker(e.pool, e.cfg, rec)
	runBackground(t, w.Run)
	waitFor(t, outcomeWait, "the bad id in the dead letters", func() bool {
		s, _ := admin.Do("ZSCORE", e.key("dead"), bad)
		return s != nil
	})
	armed.Store(true)
	id, err := idOf(e.client(t).Enqueue(context.Background(), "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the good task to run", func() bool { return rec.count(id) == 1 })
	if armed.Load() {
		t.Fatal("the pop reply was never lost")
	}
	waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })

	if typ, _ := redis.String(admin.Do("TYPE", e.key("bad:t:"+bad))); typ != "list" {
		t.Fatalf("bad:t:%s is %q, want the list set aside", bad, typ)
	}
	info, err := e.client(t).Lookup(context.Background(), bad)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != StateDead || !strings.Contains(info.LastError, "wrong type") || info.Queue != "default" {
		t.Fatalf("bad id: state %s, queue %q, reason %q; want dead in default saying wrong type", info.State, info.Queue, info.LastError)
	}
	qs, _ := redis.Strings(admin.Do("SMEMBERS", e.key("queues")))
	for _, q := range qs {
		if q != "default" {
			t.Fatalf("queues holds %q", q)
		}
	}
	if n, _ := redis.Int(admin.Do("EXISTS", e.key("st:unknown"))); n != 0 {
		t.Fatal("st:unknown exists")
	}
}

// stuckStore fails every attempt to record the result of one task, and
// loses the reply of one pop of another (alone or behind a result), so that one slot keeps failing
// while the others work and the worker has a lost pop to recover.
type stuckStore struct {
	store
	stuck    atomic.Value // id whose result cannot be recorded
	losePop  atomic.Bool  // lose the reply of the next pop that takes a task
	lostID   atomic.Value // the id whose pop reply was lost
	attempts atomic.Int32
}

func (s *stuckStore) is(v *atomic.Value, id string) bool {
	x, _ := v.Load().(string)
	return x != "" && x == id
}

func (s *stuckStore) Pop(ctx context.Context, l *lane, p string, n int) (popRes, error) {
	r, err := s.store.Pop(ctx, l, p, n)
	if n == 1 && len(r.ids) == 1 && s.losePop.CompareAndSwap(true, false) {
		s.lostID.Store(r.ids[0])
		return popRes{}, errInjected
	}
	return r, err
}

func (s *stuckStore) Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error) {
	for _, it := range req.items {
		if s.is(&s.stuck, it.ID) {
			s.attempts.Add(1)
			return finishRes{sent: true}, errInjected
		}
	}
	res, err := s.store.Finish(ctx, l, req)
	if len(res.popped) == 1 && req.popN == 1 && s.losePop.CompareAndSwap(true, false) {
		// The next task taken with the result: lose that reply instead.
		s.lostID.Store(res.popped[0])
		res.popped, res.popLost = nil, true
	}
	return res, err
}

// An error that persists in one slot leaves the other slots working and
// the worker's recovery of lost pops running, and it is not retried past
// the run's lease.
func TestPersistentErrorInOneSlot(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		rec := newRecorder(nil)
		e.cfg.Concurrency = 2
		var gaveUp <-chan struct{}
		e.cfg.Logger, gaveUp = logSignal(e.cfg.Logger, "could not record a task's result before its lease ended")
		w, _ := newWorker(e.pool, e.cfg, rec)
		ss := &stuckStore{store: w.store}
		w.setStore(ss)
		stuck, _ := idOf(c.Enqueue(ctx, "t", nil, Timeout(2*time.Second)))
		ss.stuck.Store(stuck)
		runBackground(t, w.Run)
		waitFor(t, outcomeWait, "the stuck slot failing", func() bool { return ss.attempts.Load() >= 2 })

		// The only task waiting: the next pop takes it, and its reply
		// is lost.
		ss.losePop.Store(true)
		lost, _ := idOf(c.Enqueue(ctx, "t", nil))
		// lostID is stored just after losePop is cleared: wait for it, not
		// for the flag, or the check below can read between the two.
		waitFor(t, outcomeWait, "the pop reply lost", func() bool {
			got, _ := ss.lostID.Load().(string)
			return got != ""
		})
		if got, _ := ss.lostID.Load().(string); got != lost {
			t.Fatalf("lost the pop of %q, want %q", got, lost)
		}
		var ids []string
		for i := 0; i < 5; i++ {
			id, _ := idOf(c.Enqueue(ctx, "t", nil))
			ids = append(ids, id)
		}
		for _, id := range append(ids, lost) {
			waitFor(t, outcomeWait, "task "+id+" done", func() bool { return e.state(t, id) == StateDone })
		}
		// Past its lease (2 s timeout + 0.5 s grace) the stuck slot gives
		// up: its task is left to a reaper, and the slot takes tasks again.
		select {
		case <-gaveUp:
		case <-time.After(outcomeWait):
			t.Fatal("the stuck slot did not give up")
		}
		n := ss.attempts.Load()
		more, _ := idOf(c.Enqueue(ctx, "t", nil))
		more2, _ := idOf(c.Enqueue(ctx, "t", nil))
		for _, id := range []string{more, more2} {
			waitFor(t, outcomeWait, "task after the stuck slot gave up", func() bool { return e.state(t, id) == StateDone })
		}
		if m := ss.attempts.Load(); m != n {
			t.Fatalf("the stuck slot tried %d more times after giving up", m-n)
		}
	})
}

// An id stranded in a live worker's in-flight list that no slot holds (a
// lost pop the worker did not notice) is returned within one
// HeartbeatInterval and runs.
func TestStrandedInflightRecovered(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		admin := e.admin(t)
		rec := newRecorder(nil)
		e.cfg.Advanced.HeartbeatInterval = 300 * time.Millisecond
		w, _ := newWorker(e.pool, e.cfg, rec)
		// Move a ready task by hand into the worker's in-flight list
		// before it starts, as a pop whose reply was lost would.
		id, err := idOf(e.client(t).Enqueue(ctx, "t", nil))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := redis.String(admin.Do("RPOPLPUSH", e.key("q:default"), e.key("f:"+w.ID()))); err != nil || got != id {
			t.Fatal(got, err)
		}
		at := time.Now()
		runBackground(t, w.Run)
		waitFor(t, outcomeWait, "the stranded task to run", func() bool { return rec.count(id) == 1 })
		if d := time.Since(at); d > e.cfg.Advanced.HeartbeatInterval+time.Second {
			t.Fatalf("recovered after %v; bound %v", d, e.cfg.Advanced.HeartbeatInterval)
		}
	})
}
