package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// A claim whose EXEC reply is lost, retried with the same ClaimState,
// recognises its own committed claim instead of dropping the task (which
// would then wait for a reaper's lease backstop). Cut after every command.
func TestClaimReplyLost(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		c := e.client(t)
		lease := func(*buckets.Record) int64 { return time.Now().Add(time.Hour).UnixMilli() }
		for limit := 1; limit <= 9; limit++ {
			id, _ := idOf(c.Enqueue(ctx, "t", nil))
			conn := e.pool.Get()
			if got, err := st.Pop(context.Background(), conn, "default", "w1"); err != nil || got != id {
				t.Fatal(got, err)
			}
			var cs buckets.ClaimState
			fc := &faultConn{Conn: conn, limit: limit, loseReply: true}
			_, _, err := st.Claim(ctx, fc, "w1", "default", id, time.Now().UnixMilli(), lease, true, &cs)
			conn.Close()
			if err == nil {
				t.Fatalf("limit %d: the fault did not fire", limit)
			}
			conn = e.pool.Get()
			rec, res, err := st.Claim(ctx, conn, "w1", "default", id, time.Now().UnixMilli(), lease, false, &cs)
			conn.Close()
			if err != nil || res != buckets.Claimed || rec.Runs != 1 || rec.Worker != "w1" {
				t.Fatalf("limit %d: retry gave %v %v %+v; want Claimed, run 1, worker w1", limit, res, err, rec)
			}
		}
	})
}

// A task whose record is deleted while it runs does not wedge the slot:
// the result is dropped with an error log and the next task runs.
func TestRecordDeletedWhileRunning(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		admin := e.admin(t)
		ran := make(chan string, 4)
		mux := NewMux()
		mux.HandleFunc("vanish", func(ctx context.Context, task *Task) error {
			_, err := admin.Do("DEL", e.key("t:"+task.ID))
			ran <- task.ID
			return err
		})
		mux.HandleFunc("t", func(ctx context.Context, task *Task) error { ran <- task.ID; return nil })
		e.cfg.Concurrency = 1
		srv, _ := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		runBackground(t, srv.Run)
		c := e.client(t)
		first, _ := idOf(c.Enqueue(ctx, "vanish", nil))
		second, _ := idOf(c.Enqueue(ctx, "t", nil))
		for _, want := range []string{first, second} {
			select {
			case got := <-ran:
				if got != want {
					t.Fatalf("ran %s, want %s", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the slot is wedged")
			}
		}
		waitFor(t, outcomeWait, "second done", func() bool { return e.state(t, second) == StateDone })
		if n, _ := redis.Int(admin.Do("ZCARD", e.key("p:"+srv.Worker.ID()))); n != 0 {
			t.Fatalf("pending set holds %d entries", n)
		}
		// The running gauge went back down with the pending entry.
		if n, _ := redis.Int(admin.Do("HGET", e.key("st:default"), "running")); n != 0 {
			t.Fatalf("running gauge %d after the deleted task's run, want 0", n)
		}
	})
}

// Keys of the wrong type in the namespace (written by hand) are set aside
// and the engine carries on: a wake-up list, a ready list, the index.
func TestWrongTypeKeys(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		admin := e.admin(t)
		c := e.client(t)
		rec := newRecorder(nil)
		e.cfg.Queues = []QueueConfig{{Name: "a"}, {Name: "b"}}
		e.cfg.StrictPriority = true
		srv, _ := newLaneServer(e.pool, e.cfg, rec, AllRoles)
		blpops := e.srv.Census.Count("BLPOP")
		runBackground(t, srv.Run)
		// Idle: the worker's waiter blocked on n:a n:b, the dispatcher on
		// its own list.
		waitFor(t, outcomeWait, "the idle BLPOPs", func() bool { return e.srv.Census.Count("BLPOP") >= blpops+2 })

		// A wake-up list the waiter blocks on.
		admin.Do("SET", e.key("n:b"), "junk")
		// A ready list a worker fetches from first.
		admin.Do("SET", e.key("q:a"), "junk")
		id1, err := idOf(c.Enqueue(ctx, "t", nil, Queue("b")))
		if err != nil {
			t.Fatalf("enqueue with a wrong-typed wake-up list: %v", err)
		}
		waitFor(t, outcomeWait, "task on b", func() bool { return rec.count(id1) == 1 })

		// The ready list and index a producer writes to.
		admin.Do("SET", e.key("q:b"), "junk")
		admin.Do("SET", e.key("sched"), "junk")
		id2, err := idOf(c.Enqueue(ctx, "t", nil, Queue("b")))
		if err != nil {
			t.Fatalf("enqueue with a wrong-typed ready list: %v", err)
		}
		id3, err := idOf(c.Enqueue(ctx, "t", nil, In(100*time.Millisecond), Queue("a")))
		if err != nil {
			t.Fatalf("enqueue with a wrong-typed index: %v", err)
		}
		waitFor(t, outcomeWait, "both tasks", func() bool { return rec.count(id2) == 1 && rec.count(id3) == 1 })
		for _, k := range []string{"n:b", "q:a", "q:b", "sched"} {
			if typ, _ := redis.String(admin.Do("TYPE", e.key("bad:"+k))); typ != "string" {
				t.Errorf("%s was not set aside (bad:%s is %q)", k, k, typ)
			}
		}
		if _, err := c.Enqueue(ctx, "", nil); !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	})
}

// Shutdown unregisters at once even when the pool's idle connections were
// closed by the server (its timeout setting): unregister retries on a
// fresh connection instead of leaving the worker to a reaper.
func TestUnregisterAfterStaleConnections(t *testing.T) {
	t.Parallel()
	e := privateEnv(t) // it sets the server's timeout
	if _, err := e.admin(t).Do("CONFIG", "SET", "timeout", "1"); err != nil {
		t.Fatal(err)
	}
	e.cfg.Advanced.HeartbeatInterval = 3 * time.Second
	e.cfg.Advanced.HeartbeatTTL = 10 * time.Second
	w, _ := newWorker(e.pool, e.cfg, NewMux())
	stop := runBackground(t, w.Run)
	// real time: the server closes connections idle past its timeout (1 s),
	// which it measures on its own clock.
	time.Sleep(2500 * time.Millisecond)
	stop()
	admin := e.admin(t)
	if n, _ := redis.Int(admin.Do("EXISTS", e.key("hb:"+w.ID()))); n != 0 {
		t.Fatal("heartbeat left behind: the worker did not unregister")
	}
	if n, _ := redis.Int(admin.Do("SISMEMBER", e.key("w"), w.ID())); n != 0 {
		t.Fatal("worker still registered")
	}
}
