package txn_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
	t.Run("redis24", func(t *testing.T) { f(t, redistest.Start24(t)) })
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
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		key := ns + ":k"
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
		t.Cleanup(func() { s.Cleanup(t, ns) })
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
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		key := ns + ":k"
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

// A held watch: a change to the held key voids the held transaction, which
// writes nothing, reports ErrConflict and still runs the commands after it.
func TestHeldConflict(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		key, side := ns+":k", ns+":side"
		var r txn.Runner
		ctx := context.Background()
		hold := func() *txn.Held {
			var held *txn.Held
			if _, err := r.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
				held = nil
				if _, err := tx.Do("GET", key); err != nil {
					return err
				}
				tx.Queue("SET", key, "claimed")
				held = tx.Hold(key)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return held
		}
		held := hold()
		if _, err := other.Do("SET", key, "changed"); err != nil {
			t.Fatal(err)
		}
		reps, after, err := held.Exec(ctx, []txn.Cmd{{Name: "SET", Args: []interface{}{key, "mine"}}},
			txn.Cmd{Name: "INCR", Args: []interface{}{side}})
		if !errors.Is(err, txn.ErrConflict) || reps != nil || len(after) != 1 || r.Conflicts() != 1 {
			t.Fatalf("Exec after a change: %v %v %v (conflicts %d); want ErrConflict, the INCR's reply, one conflict", reps, after, err, r.Conflicts())
		}
		if v, _ := redis.String(conn.Do("GET", key)); v != "changed" {
			t.Fatalf("key %q: a voided held transaction wrote", v)
		}
		if n, _ := redis.Int(after[0], nil); n != 1 {
			t.Fatalf("after reply %v, want 1", after[0])
		}
		if _, _, err := held.Exec(ctx, nil); !errors.Is(err, txn.ErrNotHeld) {
			t.Fatalf("second Exec: %v, want ErrNotHeld", err)
		}
		// Unchanged: the held transaction commits in one round trip.
		held = hold()
		if _, _, err := held.Exec(ctx, []txn.Cmd{{Name: "SET", Args: []interface{}{key, "mine"}}}); err != nil {
			t.Fatal(err)
		}
		if v, _ := redis.String(conn.Do("GET", key)); v != "mine" {
			t.Fatalf("key %q, want mine", v)
		}
		// Released: the connection no longer watches the key.
		held = hold()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		other.Do("SET", key, "again")
		if _, err := r.Run(ctx, conn, nil, func(tx *txn.Tx) error { tx.Queue("SET", side, "x"); return nil }); err != nil {
			t.Fatalf("a transaction after Release: %v", err)
		}
	})
}

// A pipeline judges each step alone: a conflict in one step is reported and
// counted, and the others commit.
func TestPipelineConflictAndErrors(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		var r txn.Runner
		boom := errors.New("boom")
		step := func(key string, build func(reads []interface{}, q *txn.Cmds) error) txn.Step {
			return txn.Step{Watch: []string{key}, Reads: []txn.Cmd{{Name: "GET", Args: []interface{}{key}}}, Build: build}
		}
		set := func(key string) func([]interface{}, *txn.Cmds) error {
			return func(_ []interface{}, q *txn.Cmds) error { q.Queue("SET", key, "done"); return nil }
		}
		steps := []txn.Step{
			step(ns+":a", set(ns+":a")),
			step(ns+":b", func(_ []interface{}, q *txn.Cmds) error {
				// Someone changes b between its read and its EXEC.
				other.Do("SET", ns+":b", "theirs")
				q.Queue("SET", ns+":b", "done")
				return nil
			}),
			step(ns+":c", func([]interface{}, *txn.Cmds) error { return boom }),
			step(ns+":d", func(_ []interface{}, q *txn.Cmds) error { q.Queue("SET", ns+":d", "v", "EX", 5); return nil }),
			step(ns+":e", set(ns+":e")),
		}
		res, err := r.Pipeline(context.Background(), conn, steps)
		if err != nil || len(res) != len(steps) {
			t.Fatalf("%d results, %v", len(res), err)
		}
		if res[0].Err != nil || len(res[0].Replies) != 1 || res[4].Err != nil {
			t.Fatalf("steps 0 and 4: %+v %+v", res[0], res[4])
		}
		if !errors.Is(res[1].Err, txn.ErrConflict) || r.Conflicts() != 1 {
			t.Fatalf("step 1: %v, conflicts %d; want ErrConflict, 1", res[1].Err, r.Conflicts())
		}
		if res[2].Err != boom || !errors.Is(res[3].Err, redis24.ErrNot24) {
			t.Fatalf("steps 2, 3: %v, %v", res[2].Err, res[3].Err)
		}
		for k, want := range map[string]string{"a": "done", "b": "theirs", "d": "", "e": "done"} {
			if v, _ := redis.String(conn.Do("GET", ns+":"+k)); v != want {
				t.Errorf("%s = %q, want %q", k, v, want)
			}
		}
	})
}

// Against a server that accepts connections and never answers, every shape
// of transaction returns by the context's deadline with an error matching
// context.DeadlineExceeded, and leaves the connection closed.
func TestDeadlineBoundsEveryRoundTrip(t *testing.T) {
	addr := silentServer(t)
	const deadline = 200 * time.Millisecond
	shapes := map[string]func(ctx context.Context, conn redis.Conn) error{
		"run with a read": func(ctx context.Context, conn redis.Conn) error {
			_, err := txn.Run(ctx, conn, []string{"k"}, func(tx *txn.Tx) error { _, err := tx.Do("GET", "k"); return err })
			return err
		},
		"run, writes only": func(ctx context.Context, conn redis.Conn) error {
			_, err := txn.Run(ctx, conn, nil, func(tx *txn.Tx) error { tx.Queue("SET", "k", "v"); return nil })
			return err
		},
		"do": func(ctx context.Context, conn redis.Conn) error {
			_, err := txn.Do(ctx, conn, "GET", "k")
			return err
		},
		"do through a pool whose connection takes no timeout": func(ctx context.Context, conn redis.Conn) error {
			p := &redis.Pool{Dial: func() (redis.Conn, error) { return noTimeoutConn{conn}, nil }}
			pc := p.Get()
			defer p.Close()
			_, err := txn.Do(ctx, pc, "GET", "k")
			return err
		},
		"pipeline": func(ctx context.Context, conn redis.Conn) error {
			var r txn.Runner
			_, err := r.Pipeline(ctx, conn, []txn.Step{{Watch: []string{"k"}, Build: func([]interface{}, *txn.Cmds) error { return nil }}})
			return err
		},
	}
	for name, f := range shapes {
		t.Run(name, func(t *testing.T) {
			conn, err := redis.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err = f(ctx, conn)
			if took := time.Since(start); took > deadline+500*time.Millisecond {
				t.Fatalf("returned after %v", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v, want context.DeadlineExceeded", err)
			}
			if conn.Err() == nil {
				t.Fatal("the connection is still open after a round trip was cut short")
			}
		})
	}
}

// A context without a deadline does not leave a round trip unbounded:
// the bound it carries (WithRoundTrip) ends the read, reported as a
// failure of the connection, not as the context's end; a blocking pop is
// left to ctx and the server.
func TestRoundTripBoundWithoutDeadline(t *testing.T) {
	addr := silentServer(t)
	const bound = 200 * time.Millisecond
	for name, wrap := range map[string]func(redis.Conn) redis.Conn{
		"connection":                       func(c redis.Conn) redis.Conn { return c },
		"connection that takes no timeout": func(c redis.Conn) redis.Conn { return noTimeoutConn{c} },
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := redis.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := txn.WithRoundTrip(context.Background(), bound)
			start := time.Now()
			_, err = txn.Do(ctx, wrap(conn), "GET", "k")
			if took := time.Since(start); took < bound || took > bound+500*time.Millisecond {
				t.Fatalf("returned after %v, want about %v", took, bound)
			}
			if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want a failure of the round trip, not the context's end", err)
			}
			if ctx.Err() != nil {
				t.Fatal("the context ended")
			}
			if conn.Err() == nil {
				t.Fatal("the connection is still open after a round trip was cut short")
			}
		})
	}
	t.Run("blocking pop", func(t *testing.T) {
		conn, err := redis.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Taken before the context, whose deadline counts from its making.
		start := time.Now()
		ctx, cancel := context.WithTimeout(txn.WithRoundTrip(context.Background(), bound), 3*bound)
		defer cancel()
		_, err = txn.Do(ctx, conn, "BLPOP", "k", 1)
		if took := time.Since(start); took < 3*bound {
			t.Fatalf("a blocking pop was cut after %v, before its context's deadline %v", took, 3*bound)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want context.DeadlineExceeded", err)
		}
	})
}

// noTimeoutConn hides the redis.ConnWithTimeout of the connection it
// wraps (keeping its redis.ConnWithContext), as some wrappers do.
type noTimeoutConn struct{ c redis.Conn }

func (n noTimeoutConn) Close() error { return n.c.Close() }
func (n noTimeoutConn) Err() error   { return n.c.Err() }
func (n noTimeoutConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return n.c.Do(cmd, args...)
}
func (n noTimeoutConn) Send(cmd string, args ...interface{}) error { return n.c.Send(cmd, args...) }
func (n noTimeoutConn) Flush() error                               { return n.c.Flush() }
func (n noTimeoutConn) Receive() (interface{}, error)              { return n.c.Receive() }
func (n noTimeoutConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return redis.DoContext(n.c, ctx, cmd, args...)
}
func (n noTimeoutConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(n.c, ctx)
}

// Do returns as soon as its context is cancelled: at once when it was
// cancelled before (closing the connection, so that commands Sent before
// it never go out with a later flush), and during a blocking pop, before
// the deadline.
func TestDoCancelled(t *testing.T) {
	addr := silentServer(t)
	conn, err := redis.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cancel()
	if err := conn.Send("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Do(ctx, conn, "GET", "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a cancelled context: %v, want context.Canceled", err)
	}
	if conn.Err() == nil {
		t.Fatal("the connection is still open, with a SET buffered for the next flush")
	}
	conn, err = redis.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := txn.Do(ctx, conn, "BLPOP", "k", 30); !errors.Is(err, context.Canceled) {
		t.Fatalf("BLPOP cancelled: %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("BLPOP returned %v after its cancel", took)
	}
}

// silentServer accepts connections and never replies.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// A hold asked for by an attempt that conflicted is given up before the
// next attempt: a change to its keys does not void the next attempt.
func TestHoldOfConflictingAttemptGivenUp(t *testing.T) {
	servers(t, func(t *testing.T, s *redistest.Server) {
		pool := s.Pool(t)
		conn, other := pool.Get(), pool.Get()
		defer conn.Close()
		defer other.Close()
		ns := redistest.Namespace(t)
		t.Cleanup(func() { s.Cleanup(t, ns) })
		key, key2 := ns+":k", ns+":k2"
		calls := 0
		var held *txn.Held
		_, err := txn.Run(context.Background(), conn, []string{key}, func(tx *txn.Tx) error {
			calls++
			held = nil
			if _, err := tx.Do("GET", key); err != nil {
				return err
			}
			switch calls {
			case 1:
				other.Do("INCR", key) // this attempt conflicts...
				held = tx.Hold(key2)  // ...after asking to hold key2
			case 2:
				other.Do("INCR", key2) // must not void this attempt
			}
			tx.Queue("SET", key, "mine")
			return nil
		})
		if err != nil || calls != 2 || held != nil {
			t.Fatalf("err %v after %d calls (held %v); want success at the second", err, calls, held)
		}
	})
}

// An attempt that the server ran none of is reported to the context's
// OnNotRun hook before Run tries again.
func TestOnNotRunReportsEachRetry(t *testing.T) {
	s := redistest.Mini(t)
	conn := s.Pool(t).Get()
	defer conn.Close()
	key := redistest.Namespace(t) + ":k"
	moved := errors.New("MOVED 1 elsewhere")
	var seen []error
	ctx := txn.OnNotRun(context.Background(), func(err error) { seen = append(seen, err) })
	r := txn.Runner{MaxBackoff: time.Millisecond}
	calls := 0
	_, err := r.Run(ctx, conn, nil, func(tx *txn.Tx) error {
		calls++
		if calls <= 2 {
			return fmt.Errorf("%w: %w", txn.ErrNotRun, moved)
		}
		tx.Queue("SET", key, "v")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || !errors.Is(seen[0], moved) || !errors.Is(seen[1], txn.ErrNotRun) {
		t.Fatalf("hook saw %v; want the two not-run errors", seen)
	}
	if v, _ := redis.String(conn.Do("GET", key)); v != "v" {
		t.Fatalf("value %q after the retries, want v", v)
	}
}

// An attempt that nothing ran because the context ended is not told to
// the OnNotRun hook: Run does not try again, and the hook keeps the reason
// the earlier attempts gave (a waiter quoting it would otherwise say only
// "deadline exceeded").
func TestOnNotRunSkipsTheContextsEnd(t *testing.T) {
	s := redistest.Mini(t)
	conn := s.Pool(t).Get()
	defer conn.Close()
	refused := errors.New("not a master")
	var seen []error
	ctx, cancel := context.WithCancel(txn.OnNotRun(context.Background(), func(err error) { seen = append(seen, err) }))
	defer cancel()
	r := txn.Runner{MaxBackoff: time.Millisecond}
	calls := 0
	_, err := r.Run(ctx, conn, nil, func(tx *txn.Tx) error {
		calls++
		if calls == 1 {
			return fmt.Errorf("%w: %w", txn.ErrNotRun, refused)
		}
		cancel()
		return fmt.Errorf("%w: %w", txn.ErrNotRun, context.Canceled)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want the context's end", err)
	}
	if len(seen) != 1 || !errors.Is(seen[0], refused) {
		t.Fatalf("hook saw %v; want only the first attempt's refusal", seen)
	}
}

// An attempt that ended with the context after nothing ran (a routing
// layer's backoff cut short) is returned as it is: its message names the
// context's end once.
func TestNotRunEndedByContextNotDoubled(t *testing.T) {
	s := redistest.Mini(t)
	conn := s.Pool(t).Get()
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r txn.Runner
	_, err := r.Run(ctx, conn, nil, func(tx *txn.Tx) error {
		cancel()
		return fmt.Errorf("%w (after %w: no master)", context.Canceled, txn.ErrNotRun)
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, txn.ErrNotRun) || strings.Count(err.Error(), "context canceled") != 1 {
		t.Fatalf("Run = %v; want the attempt's error, naming the cancel once", err)
	}
}
