package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
