package txn_test

import (
	"context"
	"errors"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// TestFenceShardMap: a fenced Runner writes while the fence key is absent
// or at most its epoch, refuses (ErrFenced, nothing written) once the key
// is past it, in Run, in Pipeline steps and in a Held transaction; a raise
// between the read and EXEC aborts the write.
func TestFenceShardMap(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		ctx := context.Background()
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		fence, key := ns+":map", ns+":x"
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		r := txn.Runner{Fence: &txn.Fence{Key: fence, Max: 2}, MaxAttempts: 2}
		set := func(v string) func(*txn.Tx) error {
			return func(tx *txn.Tx) error { tx.Queue("SET", key, v); return nil }
		}
		get := func() string { v, _ := redis.String(other.Do("GET", key)); return v }

		if _, err := r.Run(ctx, conn, nil, set("a")); err != nil || get() != "a" {
			t.Fatalf("no fence key: %v, value %q", err, get())
		}
		if _, err := other.Do("SET", fence, "2"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Run(ctx, conn, nil, set("b")); err != nil || get() != "b" {
			t.Fatalf("fence at the epoch: %v, value %q", err, get())
		}
		// Held: the next transaction aborts when the fence moved between.
		var held *txn.Held
		if _, err := r.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
			held = tx.Hold(key)
			tx.Queue("SET", key, "c")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Do("SET", fence, "3"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := held.Exec(ctx, []txn.Cmd{{Name: "SET", Args: []interface{}{key, "d"}}}); !errors.Is(err, txn.ErrConflict) || get() != "c" {
			t.Fatalf("held exec after the fence moved: %v, value %q", err, get())
		}
		_, err := r.Run(ctx, conn, nil, set("e"))
		var fe *txn.FenceError
		if !errors.Is(err, txn.ErrFenced) || !errors.As(err, &fe) || fe.Got != "3" || get() != "c" {
			t.Fatalf("fence past the epoch: %v, value %q", err, get())
		}
		res, err := r.Pipeline(ctx, conn, []txn.Step{{Build: func(_ []interface{}, q *txn.Cmds) error {
			q.Queue("SET", key, "f")
			return nil
		}}})
		if err != nil || len(res) != 1 || !errors.Is(res[0].Err, txn.ErrFenced) || get() != "c" {
			t.Fatalf("pipeline step past the epoch: %v %+v, value %q", err, res, get())
		}
		// A raise after the read aborts EXEC: the write never lands.
		if _, err := other.Do("SET", fence, "1"); err != nil {
			t.Fatal(err)
		}
		calls := 0
		_, err = r.Run(ctx, conn, nil, func(tx *txn.Tx) error {
			calls++
			if calls == 1 {
				if _, err := other.Do("SET", fence, "5"); err != nil {
					return err
				}
			}
			tx.Queue("SET", key, "g")
			return nil
		})
		if !errors.Is(err, txn.ErrFenced) || get() != "c" {
			t.Fatalf("fence raised before EXEC: %v, value %q", err, get())
		}
	})
}
