package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// eachRealServer runs f against Redis 7 and, when REDIS24_SERVER names
// one, the real Redis 2.4.
func eachRealServer(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("redis7", func(t *testing.T) { t.Parallel(); f(t, realEnv(t)) })
	t.Run("redis24", func(t *testing.T) { t.Parallel(); f(t, newEnv(t, redistest.Start24(t))) })
}

// gate holds handlers inside until released, and counts them.
type gate struct {
	inside, max, started atomic.Int64
	release              chan struct{}
}

func newGate() *gate { return &gate{release: make(chan struct{}, 1000)} }

func (g *gate) handler(ctx context.Context, t *Task) error {
	n := g.inside.Add(1)
	g.started.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			break
		}
	}
	defer g.inside.Add(-1)
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return nil
}

// slotWakes wraps the connections of a pool and sends on woke each time a
// BLPOP answers with a token of a slot wake-up list.
type slotWakes struct {
	redis.Conn
	woke chan string
}

func (c *slotWakes) saw(rep interface{}) {
	if vs, ok := rep.([]interface{}); ok && len(vs) == 2 {
		if k, ok := vs[0].([]byte); ok && strings.Contains(string(k), ":sw:") {
			select {
			case c.woke <- string(k):
			default:
			}
		}
	}
}

func (c *slotWakes) Do(cmd string, args ...interface{}) (interface{}, error) {
	rep, err := c.Conn.Do(cmd, args...)
	if cmd == "BLPOP" {
		c.saw(rep)
	}
	return rep, err
}

func (c *slotWakes) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	rep, err := redis.DoWithTimeout(c.Conn, d, cmd, args...)
	if cmd == "BLPOP" {
		c.saw(rep)
	}
	return rep, err
}

func (c *slotWakes) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	rep, err := redis.DoContext(c.Conn, ctx, cmd, args...)
	if cmd == "BLPOP" {
		c.saw(rep)
	}
	return rep, err
}

func (c *slotWakes) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *slotWakes) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

// slotsInUse reads sl:<q> (0 when absent).
func (e *env) slotsInUse(t testing.TB, q string) int64 {
	t.Helper()
	c := e.admin(t)
	defer c.Close()
	n, err := redis.Int64(c.Do("GET", e.key("sl:"+q)))
	if err == redis.ErrNil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two worker processes of 10 slots each, on a queue limited to 3: at most
// 3 of its handlers run at once, and 3 do while its backlog is deep; a
// handler that ends lets the next task start at once, a waiting worker
// woken by the slot's token; another queue keeps flowing meanwhile.
func TestQueueLimitAcrossServers(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		woke := make(chan string, 64)
		base := e.pool
		e.pool = &redisPool{MaxIdle: 16, Dial: func() (redisConn, error) {
			c, err := base.Dial()
			if err != nil {
				return nil, err
			}
			return &slotWakes{Conn: c, woke: woke}, nil
		}}
		cfg := e.cfg
		cfg.Concurrency = 10
		cfg.Advanced.IdleWait = 10 * time.Second
		cfg.Queues = []QueueConfig{{Name: "mail", MaxRunning: 3}, {Name: "other"}}
		g := newGate()
		var others atomic.Int64
		mux := NewMux()
		mux.HandleFunc("hold", g.handler)
		mux.HandleFunc("quick", func(context.Context, *Task) error { others.Add(1); return nil })
		for range 2 {
			srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
			if err != nil {
				t.Fatal(err)
			}
			runBackground(t, srv.Run)
		}
		c := e.client(t)
		var batch []NewTask
		for range 10 {
			batch = append(batch, NewTask{Type: "hold", Options: []Option{Queue("mail")}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "3 handlers of the limited queue", func() bool { return g.inside.Load() == 3 })
		// The other queue flows while the limited one is full.
		for range 5 {
			if _, err := c.Enqueue(ctx, "quick", nil, Queue("other")); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, outcomeWait, "the other queue's tasks", func() bool { return others.Load() == 5 })
		if n := g.inside.Load(); n != 3 || g.started.Load() != 3 {
			t.Fatalf("%d inside, %d started while 7 wait; want 3 and 3", n, g.started.Load())
		}
		if n := e.slotsInUse(t, "mail"); n != 3 {
			t.Fatalf("sl:mail = %d, want 3", n)
		}
		// Drain what the waiters popped so far: the next wake must be the
		// release's.
		for len(woke) > 0 {
			<-woke
		}
		g.release <- struct{}{}
		select {
		case k := <-woke:
			if !strings.HasSuffix(k, ":sw:mail") {
				t.Fatalf("woke on %s", k)
			}
		case <-time.After(outcomeWait):
			t.Fatal("no waiter woke on the slot's token")
		}
		waitFor(t, outcomeWait, "the 4th task to start", func() bool { return g.started.Load() == 4 && g.inside.Load() == 3 })
		for range 9 {
			g.release <- struct{}{}
		}
		waitFor(t, outcomeWait, "every task", func() bool { return g.started.Load() == 10 && g.inside.Load() == 0 })
		if m := g.max.Load(); m != 3 {
			t.Fatalf("at most %d handlers at once, want exactly 3", m)
		}
		waitFor(t, outcomeWait, "the slots to be given back", func() bool { return e.slotsInUse(t, "mail") == 0 })
	})
}

// A worker that dies holding slots: the reaper returns its tasks and
// their slots, and the count ends at 0.
func TestQueueLimitWorkerDies(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		if err := c.SetQueueLimits(ctx, QueueConfig{Name: "mail", MaxRunning: 3}); err != nil {
			t.Fatal(err)
		}
		var batch []NewTask
		for range 5 {
			batch = append(batch, NewTask{Type: "t", Options: []Option{Queue("mail")}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// A "worker" that claims and dies: no heartbeat at all.
		st := e.store(t)
		conn := e.pool.Get()
		defer conn.Close()
		lease := func(*bucketsRecord) int64 { return time.Now().Add(time.Hour).UnixMilli() }
		var got []buckets.ClaimResult
		for range 4 {
			id, err := st.Pop(ctx, conn, "mail", "ghost")
			if err != nil || id == "" {
				t.Fatal(id, err)
			}
			_, res, err := st.Claim(ctx, conn, "ghost", "mail", id, time.Now().UnixMilli(), lease, false, &buckets.ClaimState{Limits: buckets.Limits{MaxRunning: 3}})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, res)
		}
		if got[0] != buckets.Claimed || got[1] != buckets.Claimed || got[2] != buckets.Claimed || got[3] != buckets.Full {
			t.Fatalf("claims %v, want 3 claimed and the 4th full", got)
		}
		if n := e.slotsInUse(t, "mail"); n != 3 {
			t.Fatalf("sl:mail = %d, want 3", n)
		}
		if _, err := conn.Do("SADD", st.Keys.Workers(), "ghost"); err != nil {
			t.Fatal(err)
		}
		rp, err := newReaper(e.pool, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		redistest.WaitUp(t, e.pool, e.cfg.Advanced.HeartbeatTTL)
		res, err := rp.Reap(ctx)
		if err != nil || res.Recovered != 3 {
			t.Fatalf("reap: %+v, %v; want 3 recovered", res, err)
		}
		if n := e.slotsInUse(t, "mail"); n != 0 {
			t.Fatalf("sl:mail = %d after the reaper, want 0", n)
		}
		if ids := e.readyIDs(t, "mail"); len(ids) != 5 {
			t.Fatalf("%d ready, want 5", len(ids))
		}
		rep, err := c.Check(ctx, CheckOptions{})
		if err != nil || len(rep.Findings) != 0 {
			t.Fatalf("check: %+v, %v", rep, err)
		}
	})
}

// A limit set at run time with the Inspector applies within a second,
// and removing it lets the waiting tasks run.
func TestQueueLimitAtRunTime(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Concurrency = 10
		cfg.Queues = []QueueConfig{{Name: "mail"}}
		g := newGate()
		mux := NewMux()
		mux.HandleFunc("hold", g.handler)
		srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		in, err := NewInspector(cfg, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.SetQueueLimits(ctx, QueueConfig{Name: "mail", MaxRunning: -1}); err == nil {
			t.Fatal("a negative limit was accepted")
		}
		if err := in.SetQueueLimits(ctx, QueueConfig{Name: "mail", MaxRunning: 2}); err != nil {
			t.Fatal(err)
		}
		// Real time is what is tested: the limit applies within a second.
		set := time.Now()
		waitFor(t, 5*time.Second, "a second past the change", func() bool { return time.Since(set) > limitRead })
		c := e.client(t)
		var batch []NewTask
		for range 6 {
			batch = append(batch, NewTask{Type: "hold", Options: []Option{Queue("mail")}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "2 handlers", func() bool { return g.inside.Load() == 2 })
		if st := queueStats(t, c, "mail"); st.MaxRunning != 2 || st.SlotsInUse != 2 {
			t.Fatalf("stats %+v, want limit 2 with 2 slots in use", st)
		}
		if err := in.SetQueueLimits(ctx, QueueConfig{Name: "mail", MaxRunning: 0}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "every task to run once the limit is gone", func() bool { return g.inside.Load() == 6 })
		if m := g.max.Load(); m != 6 {
			t.Fatalf("max %d", m)
		}
		for range 6 {
			g.release <- struct{}{}
		}
		waitFor(t, outcomeWait, "the slots to be given back", func() bool { return g.inside.Load() == 0 && e.slotsInUse(t, "mail") == 0 })
	})
}

// The checker finds a count of slots that no running task holds, and the
// repair sets it right.
func TestQueueLimitCheckRepair(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		if err := c.SetQueueLimits(ctx, QueueConfig{Name: "mail", MaxRunning: 3}); err != nil {
			t.Fatal(err)
		}
		a := e.admin(t)
		defer a.Close()
		if _, err := a.Do("SET", e.key("sl:mail"), "2"); err != nil {
			t.Fatal(err)
		}
		rep, err := c.Check(ctx, CheckOptions{})
		if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != "slots" || rep.Findings[0].Stored != 2 || rep.Findings[0].Counted != 0 {
			t.Fatalf("check: %+v, %v; want one slots finding", rep, err)
		}
		rep, err = c.Check(ctx, CheckOptions{Repair: true})
		if err != nil || rep.Repaired != 1 || len(rep.Remaining) != 0 {
			t.Fatalf("repair: %+v, %v", rep, err)
		}
		if n := e.slotsInUse(t, "mail"); n != 0 {
			t.Fatalf("sl:mail = %d after the repair", n)
		}
	})
}

// The limit is the queue's, whatever the level: tasks of levels 1 and 3
// share the queue's slots.
func TestQueueLimitAcrossLevels(t *testing.T) {
	t.Parallel()
	eachRealServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Concurrency = 10
		cfg.Queues = []QueueConfig{{Name: "mail", MaxRunning: 2}}
		g := newGate()
		mux := NewMux()
		mux.HandleFunc("hold", g.handler)
		c := e.client(t)
		var batch []NewTask
		for i := range 6 {
			batch = append(batch, NewTask{Type: "hold", Options: []Option{Queue("mail"), Priority(1 + 2*(i%2))}})
		}
		if _, err := c.EnqueueBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		for done := 0; done < 6; done++ {
			waitFor(t, outcomeWait, "2 handlers inside", func() bool { return g.inside.Load() == int64(min(2, 6-done)) })
			g.release <- struct{}{}
		}
		waitFor(t, outcomeWait, "every task", func() bool { return g.started.Load() == 6 && g.inside.Load() == 0 })
		if m := g.max.Load(); m != 2 {
			t.Fatalf("at most %d handlers at once, want exactly 2", m)
		}
		waitFor(t, outcomeWait, "the slots to be given back", func() bool { return e.slotsInUse(t, "mail") == 0 })
	})
}
