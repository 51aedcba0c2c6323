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
			res, err := s.Requeue(ctx, c, w1, []string{"a"}, t0+30, LeaseExpired, 3)
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
