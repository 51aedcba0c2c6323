package buckets

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

// A ready list replaced by a string between a transaction's reads and its
// EXEC: the push into it fails while the rest of the transaction runs (no
// rollback). The repair sets the string aside and places the task again,
// so the task is in its ready list, never in no list at all.
func TestRepairPlacementAfterWrongTypedReadyList(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(s *Store, c redis.Conn) error
	}{
		{"Requeue", func(s *Store, c redis.Conn) error {
			_, err := s.Requeue(testCtx(t), c, w1, []string{"a"}, t0+30, WorkerDied, 3)
			return err
		}},
		{"Finish/retry now", func(s *Store, c redis.Conn) error {
			_, _, err := s.Finish(testCtx(t), c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome {
				r.State, r.Attempts, r.Due = StateRetry, 1, t0
				return Again
			})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, pool, admin := realStore(t)
			conn := pool.Get()
			defer conn.Close()
			if err := claimed("a")(testCtx(t), st, conn); err != nil {
				t.Fatal(err)
			}
			ready := st.Keys.Ready("q")
			hc := &hookConn{Conn: pool.Get(), hook: func() error {
				_, err := admin.Do("SET", ready, "not a list")
				return err
			}}
			defer hc.Close()
			set := 0
			st.OnSetAside = func(key, _ string) {
				if key == ready {
					set++
				}
			}
			if err := tc.op(st, hc); err != nil {
				t.Fatalf("%s: %v; want the push repaired", tc.name, err)
			}
			if !hc.fired {
				t.Fatal("the hook never ran: the transaction sent no MULTI")
			}
			ids, err := redis.Strings(admin.Do("LRANGE", ready, 0, -1))
			if err != nil || len(ids) != 1 || ids[0] != "a" {
				t.Fatalf("ready list = %v, %v; want [a]", ids, err)
			}
			if s, _ := redis.String(admin.Do("GET", st.Keys.Quarantine(ready))); s != "not a list" || set != 1 {
				t.Fatalf("quarantine holds %q, OnSetAside told %d times; want the string set aside once", s, set)
			}
		})
	}
}
