package buckets

import (
	"context"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// A running task whose record was destroyed (garbage, or deleted) is
// buried by Requeue with the reason, never dropped: nothing vanishes.
func TestRequeueBuriesBadRecords(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage []interface{} // command that destroys t:a
		reason string
	}{
		{"undecodable", []interface{}{"SET", "garbage"}, "malformed"},
		{"missing", []interface{}{"DEL"}, "task record missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := redistest.Namespace(t)
			t.Cleanup(func() { srv.Cleanup(t, ns) })
			s, err := NewStore(ns, 1000)
			if err != nil {
				t.Fatal(err)
			}
			c := pool.Get()
			defer c.Close()
			if err := claimed("a")(ctx, s, c); err != nil {
				t.Fatal(err)
			}
			args := append([]interface{}{s.Keys.Task("a")}, tc.damage[1:]...)
			if _, err := c.Do(tc.damage[0].(string), args...); err != nil {
				t.Fatal(err)
			}
			res, err := s.Requeue(ctx, c, w1, []string{"a"}, t0+6000, LeaseExpired, 3)
			if err != nil || res.Requeued != 0 || res.Buried != 1 || res.Dropped != 0 || len(res.Recovered) != 0 {
				t.Fatalf("Requeue = %+v, %v; want 1 buried", res, err)
			}
			if n, _ := redis.Int(c.Do("ZCARD", s.Keys.Pending(w1))); n != 0 {
				t.Errorf("the id is still pending under the worker")
			}
			ids, err := s.DeadIDs(ctx, c, 0, 10)
			if err != nil || len(ids) != 1 || ids[0] != "a" {
				t.Fatalf("dead letters %v, %v; want [a]", ids, err)
			}
			recs, errs, err := s.Records(ctx, c, ids)
			if err != nil || errs[0] != nil {
				t.Fatalf("dead letter record: %v, %v", err, errs[0])
			}
			if r := recs[0]; r.State != StateDead || !strings.Contains(r.LastError, tc.reason) {
				t.Errorf("dead letter %+v: want state dead, reason containing %q", r, tc.reason)
			}
		})
	}
}

// A reaper judges a worker dead, or a lease over, from a read made before
// its transaction: Requeue and RecoverAllInflight judge again inside it.
// A worker whose heartbeat is back (it beat again after a restarted
// server had expired its key) keeps its running and taken tasks, and a
// lease renewed since it was listed is kept.
func TestRequeueJudgesAgain(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ctx := context.Background()
	setup := func(t *testing.T) (*Store, redis.Conn) {
		ns := redistest.Namespace(t)
		t.Cleanup(func() { srv.Cleanup(t, ns) })
		s, err := NewStore(ns, 1000)
		if err != nil {
			t.Fatal(err)
		}
		c := pool.Get()
		t.Cleanup(func() { c.Close() })
		return s, c
	}
	// back is setup with task a in the state seed leaves, under worker
	// w1 whose heartbeat is back.
	back := func(t *testing.T, seed func(context.Context, *Store, redis.Conn) error) (*Store, redis.Conn) {
		s, c := setup(t)
		if err := seed(ctx, s, c); err != nil {
			t.Fatal(err)
		}
		if err := s.Beat(ctx, c, w1, 10, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		return s, c
	}
	state := func(t *testing.T, s *Store, c redis.Conn, id string) string {
		recs, errs, err := s.Records(ctx, c, []string{id})
		if err != nil || errs[0] != nil {
			t.Fatalf("record %s: %v, %v", id, err, errs[0])
		}
		return recs[0].State.String()
	}
	t.Run("worker back", func(t *testing.T) {
		t.Parallel()
		s, c := back(t, claimed("a"))
		res, err := s.Requeue(ctx, c, w1, []string{"a"}, t0+30, WorkerDied, 3)
		if err != nil || !res.Alive || res.Requeued+res.Buried != 0 {
			t.Fatalf("Requeue = %+v, %v; want the worker alive, nothing returned", res, err)
		}
		if got := state(t, s, c, "a"); got != StateRunning.String() {
			t.Errorf("task a is %s; want still running", got)
		}
		if n, _ := redis.Int(c.Do("ZCARD", s.Keys.Pending(w1))); n != 1 {
			t.Errorf("pending set holds %d; want 1", n)
		}
		if _, err := c.Do("DEL", s.Keys.Heartbeat(w1)); err != nil {
			t.Fatal(err)
		}
		res, err = s.Requeue(ctx, c, w1, []string{"a"}, t0+30, WorkerDied, 3)
		if err != nil || res.Alive || res.Requeued != 1 {
			t.Fatalf("Requeue once the heartbeat is gone = %+v, %v; want 1 requeued", res, err)
		}
	})
	t.Run("in-flight of a worker back", func(t *testing.T) {
		t.Parallel()
		s, c := back(t, popped("a"))
		res, err := s.RecoverAllInflight(ctx, c, w1, t0+30, true)
		if err != nil || !res.Alive || res.Requeued != 0 {
			t.Fatalf("RecoverAllInflight (reaper) = %+v, %v; want the worker alive, nothing returned", res, err)
		}
		if n, _ := redis.Int(c.Do("LLEN", s.Keys.Inflight(w1))); n != 1 {
			t.Errorf("in-flight list holds %d; want 1", n)
		}
		// The worker emptying its own list needs no death.
		res, err = s.RecoverAllInflight(ctx, c, w1, t0+30, false)
		if err != nil || res.Requeued != 1 {
			t.Fatalf("RecoverAllInflight (own) = %+v, %v; want 1 requeued", res, err)
		}
	})
	t.Run("lease renewed", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t)
		if err := claimed("a")(ctx, s, c); err != nil {
			t.Fatal(err)
		}
		deadline, err := redis.Int64(c.Do("ZSCORE", s.Keys.Pending(w1), "a"))
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Requeue(ctx, c, w1, []string{"a"}, deadline-1, LeaseExpired, 3)
		if err != nil || res.Requeued+res.Buried != 0 || res.Dropped != 1 {
			t.Fatalf("Requeue before the deadline = %+v, %v; want it kept (dropped from the return)", res, err)
		}
		if got := state(t, s, c, "a"); got != StateRunning.String() {
			t.Errorf("task a is %s; want still running", got)
		}
		res, err = s.Requeue(ctx, c, w1, []string{"a"}, deadline, LeaseExpired, 3)
		if err != nil || res.Requeued != 1 {
			t.Fatalf("Requeue at the deadline = %+v, %v; want 1 requeued", res, err)
		}
	})
}
