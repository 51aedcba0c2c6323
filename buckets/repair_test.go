package buckets

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// A ready list replaced by a string between a transaction's reads and its
// EXEC: the push into it fails while the rest of the transaction runs (no
// rollback). The repair sets the string aside and places the task again,
// so the task is in its ready list, never in no list at all.
func TestRepairPlacementAfterWrongTypedReadyList(t *testing.T) {
	t.Parallel()
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
			st, pool, admin, ready, trap := readyTrap(t)
			hc := &hookConn{Conn: pool.Get(), hook: trap}
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

// readyTrap claims task "a" of queue q for w1 on a real store and returns,
// with the store, its pool and an admin connection, q's ready list and a
// hook that makes it a string (a hookConn's, run at the next MULTI).
func readyTrap(t *testing.T) (st *Store, pool *redis.Pool, admin redis.Conn, ready string, trap func() error) {
	t.Helper()
	st, pool, admin = realStore(t)
	conn := pool.Get()
	defer conn.Close()
	if err := claimed("a")(testCtx(t), st, conn); err != nil {
		t.Fatal(err)
	}
	ready = st.Keys.Ready("q")
	return st, pool, admin, ready, stringTrap(admin, ready, "not a list")
}

// stringTrap returns a hook (hookConn's) that makes key the string s.
func stringTrap(admin redis.Conn, key, s string) func() error {
	return func() error {
		_, err := admin.Do("SET", key, s)
		return err
	}
}

// cutConn is hookConn that also fails as a cut connection would once
// cutAt commands have been sent after the transaction's first EXEC: the
// repair's own round trips then fail.
type cutConn struct {
	hookConn
	cutAt  int // commands after the first EXEC that go through; the next fails
	execed bool
	after  int
	cut    bool
}

func (c *cutConn) Send(name string, args ...interface{}) error {
	if err := c.count(name); err != nil {
		return err
	}
	return c.hookConn.Send(name, args...)
}

// count counts a command about to be sent, and fails it past cutAt.
func (c *cutConn) count(name string) error {
	if c.execed {
		if c.after >= c.cutAt {
			if !c.cut {
				c.cut = true
				c.Conn.Close()
			}
			return errors.New("cut: use of closed network connection")
		}
		c.after++
	}
	if name == "EXEC" {
		c.execed = true
	}
	return nil
}

func (c *cutConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if err := c.fire(name); err != nil {
		return nil, err
	}
	if name != "" {
		if err := c.count(name); err != nil {
			return nil, err
		}
	}
	return redis.DoContext(c.Conn, ctx, name, args...)
}

// The transaction's EXEC ran with its push into a ready list refused (a
// string written between its reads and its EXEC), and then the repair's
// own connection was cut: in SetAside, or as it placed the task again.
// With Redial the repair goes on at once on a fresh connection; without
// it, the repair is kept (Unplaced) and the Store's next placing
// transaction, or PlaceAgain, applies it. Either way the task ends in its
// ready list, never in no list.
func TestRepairPlacementSurvivesACutConnection(t *testing.T) {
	t.Parallel()
	// Commands that go through after the first EXEC: SetAside is WATCH,
	// TYPE, MULTI, RENAME, EXEC; then the placing MULTI, RPUSH...
	for _, cut := range []struct {
		name string
		at   int
	}{{"in set aside", 1}, {"placing again", 6}} {
		for _, redial := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/redial=%v", cut.name, redial), func(t *testing.T) {
				st, pool, admin, ready, trap := readyTrap(t)
				conn := pool.Get()
				defer conn.Close()
				cc := &cutConn{hookConn: hookConn{Conn: pool.Get(), hook: trap}, cutAt: cut.at}
				defer cc.Close()
				var dials *int
				if redial {
					dials = countRedials(st, pool)
				}
				_, err := st.Requeue(testCtx(t), cc, w1, []string{"a"}, t0+30, WorkerDied, 3)
				if !cc.cut {
					t.Fatal("the connection was never cut: the repair sent less than the test expects")
				}
				inReady := func() []string { return readyIDs(t, admin, ready) }
				if redial {
					if err != nil || *dials == 0 {
						t.Fatalf("Requeue = %v after %d redials; want the repair done on a fresh connection", err, *dials)
					}
					if ids := inReady(); len(ids) != 1 || ids[0] != "a" || st.Unplaced() != 0 {
						t.Fatalf("ready list %v, %d kept; want [a], none kept", ids, st.Unplaced())
					}
					return
				}
				if err == nil || st.Unplaced() != 1 {
					t.Fatalf("Requeue = %v with %d repairs kept; want an error and the repair kept", err, st.Unplaced())
				}
				if ids := inReady(); len(ids) != 0 {
					t.Fatalf("ready list %v before the repair is applied", ids)
				}
				// The Store's next transaction that places tasks applies it
				// first (here a Requeue with nothing to return).
				if _, err := st.Requeue(testCtx(t), conn, w1, []string{"zz"}, t0+40, WorkerDied, 3); err != nil {
					t.Fatal(err)
				}
				if ids := inReady(); len(ids) != 1 || ids[0] != "a" || st.Unplaced() != 0 {
					t.Fatalf("ready list %v, %d kept; want [a] placed by the next transaction", ids, st.Unplaced())
				}
				if r := mustRecord(t, testCtx(t), st, admin, "a"); r.State != StateWaiting {
					t.Fatalf("record %+v; want waiting", r)
				}
				if s, _ := redis.String(admin.Do("GET", st.Keys.Quarantine(ready))); s != "not a list" {
					t.Fatalf("quarantine holds %q; want the string set aside", s)
				}
			})
		}
	}
}

// countRedials makes st redial from pool, counting the dials in the
// returned counter.
func countRedials(st *Store, pool *redis.Pool) *int {
	dials := new(int)
	st.Redial = func(ctx context.Context) (redis.Conn, error) {
		*dials++
		return pool.GetContext(ctx)
	}
	return dials
}

// readyIDs reads the ready list ready; nil while it is still the string a
// trap wrote there (not set aside yet).
func readyIDs(t *testing.T, admin redis.Conn, ready string) []string {
	t.Helper()
	ids, err := redis.Strings(admin.Do("LRANGE", ready, 0, -1))
	if IsWrongType(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("LRANGE ready: %v", err)
	}
	return ids
}

// An enqueue's EXEC ran with its push into the ready list refused (a
// string written between the commands' building and the EXEC), and then
// the repair's own connection was cut: in SetAside, or as it placed the
// task again. As for the other placing transactions, the repair goes on
// on a fresh connection with Redial, and without it is kept and applied
// by the Store's next enqueue: the written task ends in its ready list,
// never in no list.
func TestRepairEnqueueSurvivesACutConnection(t *testing.T) {
	t.Parallel()
	for _, cut := range []struct {
		name string
		at   int
	}{{"in set aside", 1}, {"placing again", 6}} {
		for _, redial := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/redial=%v", cut.name, redial), func(t *testing.T) {
				st, pool, admin := realStore(t)
				ready := st.Keys.Ready("q")
				now := time.Now().UnixMilli()
				rec := func(id string) *Record {
					return &Record{ID: id, Queue: "q", Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: now}
				}
				cc := &cutConn{hookConn: hookConn{Conn: pool.Get(), hook: stringTrap(admin, ready, "not a list")}, cutAt: cut.at}
				defer cc.Close()
				var dials *int
				if redial {
					dials = countRedials(st, pool)
				}
				err := st.Enqueue(testCtx(t), cc, now, []*Record{rec("a")})
				if !cc.cut {
					t.Fatal("the connection was never cut: the repair sent less than the test expects")
				}
				inReady := func() []string { return readyIDs(t, admin, ready) }
				if redial {
					if !errors.Is(err, ErrSetAside) || *dials == 0 {
						t.Fatalf("Enqueue = %v after %d redials; want ErrSetAside, the repair done on a fresh connection", err, *dials)
					}
					if ids := inReady(); len(ids) != 1 || ids[0] != "a" || st.Unplaced() != 0 {
						t.Fatalf("ready list %v, %d kept; want [a], none kept", ids, st.Unplaced())
					}
					return
				}
				if err == nil || errors.Is(err, ErrSetAside) || st.Unplaced() != 1 {
					t.Fatalf("Enqueue = %v with %d repairs kept; want an error and the repair kept", err, st.Unplaced())
				}
				if ids := inReady(); len(ids) != 0 {
					t.Fatalf("ready list %v before the repair is applied", ids)
				}
				// The Store's next enqueue applies it first.
				conn := pool.Get()
				defer conn.Close()
				if err := st.Enqueue(testCtx(t), conn, now, []*Record{rec("b")}); err != nil {
					t.Fatal(err)
				}
				if ids := inReady(); len(ids) != 2 || ids[0] != "b" || ids[1] != "a" || st.Unplaced() != 0 {
					t.Fatalf("ready list %v, %d kept; want [b a]: a placed by the next enqueue", ids, st.Unplaced())
				}
			})
		}
	}
}

// PlaceAgain keeps what it cannot apply, and applies it on the next call.
func TestPlaceAgainKeepsWhatFails(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ready := st.Keys.Ready("q")
	if _, err := admin.Do("SET", ready, "not a list"); err != nil {
		t.Fatal(err)
	}
	var fix placementFix
	fix.aside = []wrongKey{{"list", ready}}
	fix.retry.Queue("RPUSH", ready, "a", "b")
	// An index entry of a bucket places no task of its own; an inline
	// entry places its task.
	inline := "0353K62eVoeBbHiHQyD0oS"
	fix.retry.Queue("ZADD", st.Keys.Schedule(), t0, Member("q", t0), t0, InlineMember("q", inline))
	st.keepUnplaced(fix)
	told := 0
	st.OnPlacedAgain = func(n int) { told += n }
	dead := pool.Get()
	dead.Close()
	if n, err := st.PlaceAgain(testCtx(t), dead); err == nil || n != 0 || st.Unplaced() != 1 {
		t.Fatalf("PlaceAgain on a closed connection = %d, %v, %d kept; want an error and the repair kept", n, err, st.Unplaced())
	}
	conn := pool.Get()
	defer conn.Close()
	if n, err := st.PlaceAgain(testCtx(t), conn); err != nil || n != 3 || st.Unplaced() != 0 || told != 3 {
		t.Fatalf("PlaceAgain = %d, %v, %d kept, OnPlacedAgain told %d; want 3 placed (a, b and the inline entry), none kept, told 3",
			n, err, st.Unplaced(), told)
	}
	if ids, _ := redis.Strings(admin.Do("LRANGE", ready, 0, -1)); len(ids) != 2 {
		t.Fatalf("ready list %v; want [a b]", ids)
	}
}

// An operator's run-now (Act) and a periodic entry's scheduling pass
// place tasks too: a push that fails inside their EXEC on a key of the
// wrong type is repaired, not left with its task in no list.
func TestRepairPlacementOfActAndSchedulePass(t *testing.T) {
	t.Parallel()
	t.Run("Act/run", func(t *testing.T) {
		st, pool, admin := realStore(t)
		conn := pool.Get()
		defer conn.Close()
		if err := st.Enqueue(testCtx(t), conn, t0, []*Record{newRec("b", t0+60_000)}); err != nil {
			t.Fatal(err)
		}
		ready := st.Keys.Ready("q")
		hc := &hookConn{Conn: pool.Get(), hook: stringTrap(admin, ready, "not a list")}
		defer hc.Close()
		res, err := st.Act(testCtx(t), hc, ActRun, []string{"b"}, t0+10, 3600, nil)
		if err != nil || res.Done != 1 || !hc.fired {
			t.Fatalf("Act = %+v, %v (hook ran: %v); want it done, the push repaired", res, err, hc.fired)
		}
		if ids, err := redis.Strings(admin.Do("LRANGE", ready, 0, -1)); err != nil || len(ids) != 1 || ids[0] != "b" {
			t.Fatalf("ready list = %v, %v; want [b]", ids, err)
		}
	})
	t.Run("SchedulePass", func(t *testing.T) {
		st, pool, admin := realStore(t)
		sched := st.Keys.Schedule()
		hc := &hookConn{Conn: pool.Get(), hook: stringTrap(admin, sched, "not a zset")}
		defer hc.Close()
		res, err := pass(testCtx(t), st, hc, "a", 1, t0, 2000, noStale)
		if err != nil || !hc.fired {
			t.Fatalf("pass = %+v, %v (hook ran: %v); want the index entries repaired", res, err, hc.fired)
		}
		n, err := redis.Int(admin.Do("ZCARD", sched))
		if err != nil || n == 0 {
			t.Fatalf("index holds %d, %v; want the firings' buckets indexed again", n, err)
		}
		if s, _ := redis.String(admin.Do("GET", st.Keys.Quarantine(sched))); s != "not a zset" {
			t.Fatalf("quarantine holds %q; want the string set aside", s)
		}
	})
}
