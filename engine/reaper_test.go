package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// Several reapers at once return each task of a dead worker exactly once.
func TestConcurrentReapers(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		want := map[string]bool{}
		var batch []NewTask
		for i := 0; i < 300; i++ {
			batch = append(batch, NewTask{Type: "t"})
		}
		ids, err := idsOf(c.EnqueueBatch(ctx, batch))
		if err != nil {
			t.Fatal(err)
		}
		// A "worker" that claims everything and dies: no heartbeat at all.
		st := e.store(t)
		conn := e.pool.Get()
		for i, id := range ids {
			want[id] = true
			got, err := st.Pop(context.Background(), conn, "default", "ghost")
			if err != nil || got == "" {
				t.Fatal(got, err)
			}
			if i%3 == 0 {
				continue // leave some in the in-flight list, unclaimed
			}
			if _, _, err := st.Claim(ctx, conn, "ghost", "default", got, time.Now().UnixMilli(),
				func(r *bucketsRecord) int64 { return time.Now().Add(time.Hour).UnixMilli() }, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		conn.Do("SADD", st.Keys.Workers(), "ghost")
		conn.Close()
		redistest.WaitUp(t, e.pool, e.cfg.Advanced.HeartbeatTTL)
		var wg sync.WaitGroup
		var recovered atomic.Int64
		for i := 0; i < 4; i++ {
			rp, _ := newReaper(e.pool, e.cfg)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 5; j++ {
					res, err := rp.Reap(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					recovered.Add(int64(res.Recovered))
				}
			}()
		}
		wg.Wait()
		if recovered.Load() != int64(len(ids)) {
			t.Fatalf("reapers report %d recovered, want %d", recovered.Load(), len(ids))
		}
		exactlyOnce(t, e.readyIDs(t, "default"), want)
		stats, _ := c.Stats(ctx)
		if stats[0].Running != 0 || stats[0].Recovered != int64(len(ids)*2/3) {
			t.Fatalf("stats %+v; want running 0, recovered %d (claimed ones)", stats[0], len(ids)*2/3)
		}
	})
}

// A server restarted less than a heartbeat TTL ago may have expired the
// heartbeats of live workers while it was down: its reaper judges no one
// dead until the server has been up a TTL, and then returns a dead
// worker's task as usual.
func TestReaperTrustsNoHeartbeatRightAfterRestart(t *testing.T) {
	t.Parallel()
	e := privateEnv(t) // its uptime is what the reaper reads
	ctx := context.Background()
	c := e.client(t)
	id, err := idOf(c.Enqueue(ctx, "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	st := e.store(t)
	conn := e.pool.Get()
	defer conn.Close()
	if got, err := st.Pop(ctx, conn, "default", "ghost"); err != nil || got != id {
		t.Fatal(got, err)
	}
	if _, _, err := st.Claim(ctx, conn, "ghost", "default", id, time.Now().UnixMilli(),
		func(r *bucketsRecord) int64 { return time.Now().Add(time.Hour).UnixMilli() }, false, nil); err != nil {
		t.Fatal(err)
	}
	// A TTL far longer than the server has been up: nothing is judged.
	cfg := e.cfg
	cfg.Advanced.HeartbeatTTL = time.Hour
	young, _ := newReaper(e.pool, cfg)
	res, err := young.Reap(ctx)
	if err != nil || res.DeadWorkers != 0 || res.Recovered != 0 {
		t.Fatalf("Reap on a server up less than a TTL = %+v, %v; want nothing judged", res, err)
	}
	if len(e.readyIDs(t, "default")) != 0 {
		t.Fatal("the running task was returned")
	}
	// Once the server has been up a TTL (1 s), the same worker is dead.
	rp, _ := newReaper(e.pool, e.cfg)
	waitFor(t, outcomeWait, "the reaper to find the worker dead", func() bool {
		res, err := rp.Reap(ctx)
		return err == nil && res.DeadWorkers == 1 && res.Recovered == 1
	})
	exactlyOnce(t, e.readyIDs(t, "default"), map[string]bool{id: true})
}
