package txn_test

import (
	"context"
	"errors"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// fullServers runs f on a real Redis 7 and a real Redis 2.4 (skipped, by
// name, without REDIS24_SERVER), each of the test's own: f fills them up.
func fullServers(t *testing.T, f func(t *testing.T, s *redistest.Server)) {
	t.Run("redis7", func(t *testing.T) { t.Parallel(); f(t, redistest.Start(t, redistest.Private())) })
	t.Run("redis24", func(t *testing.T) { t.Parallel(); f(t, redistest.Start24(t)) })
}

// fill makes every write that can grow memory fail on s (maxmemory 1 byte,
// no eviction) until the returned function lifts the limit.
func fill(t *testing.T, s *redistest.Server) func() {
	t.Helper()
	admin := s.Admin(t)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if _, err := admin.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatalf("CONFIG SET %s: %v", kv[0], err)
		}
	}
	return func() {
		if _, err := admin.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
			t.Fatalf("CONFIG SET maxmemory 0: %v", err)
		}
	}
}

// notInMulti checks that the pool's one connection runs commands at once:
// a connection left inside MULTI would answer QUEUED.
func notInMulti(t *testing.T, pool *redis.Pool, key, want string) {
	t.Helper()
	c := pool.Get()
	defer c.Close()
	got, err := redis.String(c.Do("GET", key))
	if err != nil || got != want {
		t.Fatalf("GET %s on the pooled connection: %q, %v; want %q (a connection left inside MULTI answers QUEUED)", key, got, err, want)
	}
}

// TestFullRedisAllOrNothing drives a full server's refusals through every
// shape of transaction: a write refused while queueing (2.4 would drop it
// and run the rest), and a transaction of deletes alone (2.4 refuses EXEC
// itself and keeps the transaction open). Each time nothing is written,
// the error matches txn.ErrFull, and the connection goes back to the pool
// outside MULTI.
func TestFullRedisAllOrNothing(t *testing.T) {
	fullServers(t, func(t *testing.T, s *redistest.Server) {
		ctx := context.Background()
		ns := redistest.Namespace(t)
		bucket, ready := ns+":bucket", ns+":ready"
		pool := s.Pool(t)
		pool.MaxIdle, pool.MaxActive, pool.Wait = 1, 1, true
		c := pool.Get()
		if _, err := c.Do("SET", bucket, "task"); err != nil {
			t.Fatal(err)
		}
		c.Close()
		lift := fill(t, s)

		var r txn.Runner
		// A move: DEL the bucket, LPUSH its task to the ready list.
		move := func(tx *txn.Tx) error {
			if _, err := tx.Do("GET", bucket); err != nil {
				return err
			}
			tx.Queue("DEL", bucket)
			tx.Queue("LPUSH", ready, "task")
			return nil
		}
		deletes := func(tx *txn.Tx) error {
			tx.Queue("DEL", bucket)
			return nil
		}
		for name, fn := range map[string]func(*txn.Tx) error{"move": move, "deletes": deletes} {
			c := pool.Get()
			_, err := r.Run(ctx, c, []string{bucket}, fn)
			c.Close()
			if !errors.Is(err, txn.ErrFull) {
				t.Fatalf("%s on a full server: %v; want an error matching txn.ErrFull", name, err)
			}
			notInMulti(t, pool, bucket, "task")
		}

		// The held shape: a committed transaction leaves a watch, and
		// the next writes under it with a command behind EXEC.
		lift()
		c = pool.Get()
		var held *txn.Held
		if _, err := r.Run(ctx, c, []string{bucket}, func(tx *txn.Tx) error {
			tx.Queue("SET", ns+":claimed", "1")
			held = tx.Hold(bucket)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		fill(t, s)
		_, after, err := held.Exec(ctx, []txn.Cmd{{Name: "DEL", Args: []interface{}{bucket}}},
			txn.Cmd{Name: "LLEN", Args: []interface{}{ready}})
		c.Close()
		if !errors.Is(err, txn.ErrFull) {
			t.Fatalf("held EXEC on a full server: %v; want txn.ErrFull", err)
		}
		if s.Is24() && after != nil {
			t.Fatalf("held EXEC refused at 2.4: the command behind it was queued, not run, yet its replies %v were returned", after)
		}
		notInMulti(t, pool, bucket, "task")

		// The pipelined shape.
		steps := []txn.Step{
			{Watch: []string{bucket}, Reads: []txn.Cmd{{Name: "GET", Args: []interface{}{bucket}}},
				Build: func(_ []interface{}, q *txn.Cmds) error {
					q.Queue("DEL", bucket)
					q.Queue("LPUSH", ready, "task")
					return nil
				}},
			{Watch: []string{bucket}, Reads: []txn.Cmd{{Name: "GET", Args: []interface{}{bucket}}},
				Build: func(_ []interface{}, q *txn.Cmds) error {
					q.Queue("DEL", bucket)
					return nil
				}},
		}
		c = pool.Get()
		res, err := r.Pipeline(ctx, c, steps)
		c.Close()
		full := err != nil && errors.Is(err, txn.ErrFull)
		for _, st := range res {
			full = full || errors.Is(st.Err, txn.ErrFull)
			if st.Err == nil {
				t.Fatalf("a pipeline step committed on a full server: %+v", st)
			}
		}
		if !full {
			t.Fatalf("pipeline on a full server: %+v, %v; want txn.ErrFull", res, err)
		}
		notInMulti(t, pool, bucket, "task")

		// Once memory is freed, the same move goes through whole.
		lift()
		c = pool.Get()
		if _, err := r.Run(ctx, c, []string{bucket}, move); err != nil {
			t.Fatalf("move after the limit was lifted: %v", err)
		}
		n, err := redis.Int(c.Do("LLEN", ready))
		c.Close()
		if err != nil || n != 1 {
			t.Fatalf("ready list after the move: %d, %v; want 1", n, err)
		}
	})
}
