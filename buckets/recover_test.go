package buckets

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// realStore returns a store on a fresh namespace of a real server, and an
// unrestricted connection for planting damage.
func realStore(t *testing.T) (*Store, *redis.Pool, redis.Conn) {
	t.Helper()
	srv := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	st, err := NewStore(ns, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return st, srv.Pool(t), srv.Admin(t)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A worker whose in-flight list or pending set is of the wrong type may
// still hold tasks: Forget must keep it registered and say why.
func TestForgetKeepsWorkerWhoseListsCannotBeRead(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"inflight", "pending"} {
		t.Run(bad, func(t *testing.T) {
			st, pool, admin := realStore(t)
			ctx := testCtx(t)
			conn := pool.Get()
			defer conn.Close()
			const w = "w1"
			key := st.Keys.Inflight(w)
			if bad == "pending" {
				key = st.Keys.Pending(w)
			}
			if _, err := admin.Do("SADD", st.Keys.Workers(), w); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Do("SET", key, "not a list"); err != nil {
				t.Fatal(err)
			}
			removed, err := st.Forget(ctx, conn, w, true)
			if removed || err == nil || !IsServerError(err) {
				t.Fatalf("Forget = %v, %v; want kept, with the server's WRONGTYPE error", removed, err)
			}
			in, err := redis.Bool(admin.Do("SISMEMBER", st.Keys.Workers(), w))
			if err != nil || !in {
				t.Fatalf("worker registered = %v, %v; want still registered", in, err)
			}
		})
	}
}

// A worker with a readable, empty in-flight list and pending set and no
// heartbeat is forgotten: the fix does not keep every worker forever.
func TestForgetRemovesIdleDeadWorker(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	if _, err := admin.Do("SADD", st.Keys.Workers(), "w1"); err != nil {
		t.Fatal(err)
	}
	removed, err := st.Forget(testCtx(t), conn, "w1", true)
	if !removed || err != nil {
		t.Fatalf("Forget = %v, %v; want removed", removed, err)
	}
}

// One queue's damaged counters must not hide the error, nor the other
// queues' figures.
func TestStatsReportsPerQueueErrors(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	now := time.Now().UnixMilli()
	for _, q := range []string{"good", "bad"} {
		r := &Record{ID: q + "-1", Queue: q, Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: now + 60_000}
		if err := st.Enqueue(ctx, conn, now, []*Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	// The bad queue's counters hash becomes a string, and its ready list
	// a set.
	for _, c := range [][]interface{}{
		{"DEL", st.Keys.Stats("bad")}, {"SET", st.Keys.Stats("bad"), "x"},
		{"SADD", st.Keys.Ready("bad"), "x"},
	} {
		if _, err := admin.Do(c[0].(string), c[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	out, err := st.Stats(testCtx(t), conn, 100)
	if err == nil || !IsServerError(err) {
		t.Fatalf("Stats error = %v; want the server's error for queue bad", err)
	}
	var re redis.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v does not wrap a redis.Error", err)
	}
	for _, want := range []string{"queue bad: counters", "queue bad: ready length"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "queue good") {
		t.Errorf("error %q blames the good queue", err)
	}
	var good *QueueStats
	for i := range out {
		if out[i].Queue == "good" {
			good = &out[i]
		}
	}
	if good == nil || good.Scheduled != 1 {
		t.Fatalf("figures of the good queue = %+v; want scheduled 1", good)
	}
}
