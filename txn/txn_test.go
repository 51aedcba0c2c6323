package txn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

func servers(t *testing.T, f func(t *testing.T, s *redistest.Server)) {
	t.Run("miniredis", func(t *testing.T) { f(t, redistest.Mini(t)) })
	t.Run("redis", func(t *testing.T) { f(t, redistest.Start(t)) })
}

func TestRetryOnConflict(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		ns := redistest.Namespace(t)
		key := ns + ":n"
		t.Cleanup(func() { s.Cleanup(t, ns) })
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		var r txn.Runner
		calls := 0
		reps, err := r.Run(context.Background(), conn, []string{key}, func(tx *txn.Tx) error {
			calls++
			n, err := redis.Int(tx.Do("GET", key))
			if err != nil && !errors.Is(err, redis.ErrNil) {
				return err
			}
			if calls == 1 {
				// Someone else changes the watched key before EXEC.
				if _, err := other.Do("SET", key, "10"); err != nil {
					return err
				}
			}
			tx.Queue("SET", key, n+1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if calls != 2 || r.Conflicts() != 1 || len(reps) != 1 {
			t.Fatalf("calls %d conflicts %d replies %v; want 2, 1, one reply", calls, r.Conflicts(), reps)
		}
		if v, _ := redis.Int(conn.Do("GET", key)); v != 11 {
			t.Fatalf("value %d, want 11: the second attempt must read again", v)
		}
	})
}

func TestConflictAttemptsUsedUp(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		key := redistest.Namespace(t) + ":k"
		r := txn.Runner{MaxAttempts: 3, MaxBackoff: time.Millisecond}
		calls := 0
		_, err := r.Run(context.Background(), conn, []string{key}, func(tx *txn.Tx) error {
			calls++
			if _, err := tx.Do("GET", key); err != nil {
				return err
			}
			other.Do("INCR", key)
			tx.Queue("SET", key, "mine")
			return nil
		})
		if !errors.Is(err, txn.ErrConflict) || calls != 3 {
			t.Fatalf("err %v after %d calls; want ErrConflict after 3", err, calls)
		}
	})
}

func TestExecElementErrors(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		pool := s.Pool(t)
		conn := pool.Get()
		defer conn.Close()
		ns := redistest.Namespace(t)
		if _, err := conn.Do("SET", ns+":str", "x"); err != nil {
			t.Fatal(err)
		}
		reps, err := txn.Run(context.Background(), conn, nil, func(tx *txn.Tx) error {
			tx.Queue("SET", ns+":a", "1")
			tx.Queue("LPUSH", ns+":str", "y") // wrong type: fails inside EXEC
			tx.Queue("SET", ns+":b", "2")
			return nil
		})
		var ee *txn.ExecError
		if !errors.As(err, &ee) || ee.Index != 1 || ee.Command != "LPUSH" || ee.Queued {
			t.Fatalf("err %v, want an ExecError for command 1 (LPUSH) inside EXEC", err)
		}
		if len(reps) != 3 {
			t.Fatalf("replies %v; want all three, since the others ran", reps)
		}
		if b, _ := redis.String(conn.Do("GET", ns+":b")); b != "2" {
			t.Fatal("the command after the failed one did not run")
		}
	})
}

func TestRefusedBeforeMulti(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		conn := s.Pool(t).Get()
		defer conn.Close()
		key := redistest.Namespace(t) + ":k"
		_, err := txn.Run(context.Background(), conn, []string{key}, func(tx *txn.Tx) error {
			tx.Queue("SET", key, "v")
			tx.Queue("SET", key, "v", "EX", 10) // a 2.6.12 form
			return nil
		})
		if !errors.Is(err, redis24.ErrNot24) {
			t.Fatalf("err %v, want redis24.ErrNot24", err)
		}
		if n, _ := redis.Int(conn.Do("EXISTS", key)); n != 0 {
			t.Fatal("a transaction with a refused command wrote something")
		}
		// The connection is usable and not left watching or in MULTI.
		if _, err := conn.Do("SET", key, "after"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestFnErrorAndCancel(t *testing.T) {
	s := redistest.Mini(t)
	conn := s.Pool(t).Get()
	defer conn.Close()
	boom := errors.New("boom")
	if _, err := txn.Run(context.Background(), conn, []string{"k"}, func(*txn.Tx) error { return boom }); err != boom {
		t.Fatalf("err %v, want fn's error unchanged", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := txn.Run(ctx, conn, nil, func(tx *txn.Tx) error { tx.Queue("SET", "k", "v"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if _, err := txn.Run(context.Background(), conn, nil, func(tx *txn.Tx) error {
		_, err := tx.Do("MULTI")
		return err
	}); err == nil {
		t.Fatal("MULTI from the function must be refused")
	}
	reps, err := txn.Run(context.Background(), conn, []string{"k"}, func(*txn.Tx) error { return nil })
	if err != nil || reps != nil {
		t.Fatalf("nothing queued: %v %v", reps, err)
	}
}
