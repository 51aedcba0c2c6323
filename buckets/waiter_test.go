package buckets

import (
	"context"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// hasCompletion reports whether task id has a completion list.
func hasCompletion(t *testing.T, st *Store, admin redis.Conn, id string) bool {
	t.Helper()
	n, err := redis.Int(admin.Do("EXISTS", st.Keys.Completion(id)))
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestCompletionOnlyWhenWaited: a success whose done record is kept at
// least as long as a completion list writes the list only for a task a
// waiter marked; one kept shorter writes it always; and Completed finds
// the outcome of an unmarked success in its record.
func TestCompletionOnlyWhenWaited(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	st.ResultTTL = 600
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := marked(claimed("a", "b", "c", "d"), "a", "c")(ctx, st, c); err != nil {
		t.Fatal(err)
	}
	done := func(*Record) Outcome { return Done }
	group := func(ttl int64, ids ...string) {
		t.Helper()
		var items []FinishItem
		for _, id := range ids {
			items = append(items, FinishItem{ID: id, Run: 1, Now: t0 + 20, Decide: done})
		}
		res, err := st.FinishGroup(ctx, c, w1, items, ttl)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	group(600, "a", "b") // kept as long as the list: only the marked one
	group(599, "c", "d") // kept shorter: both
	for id, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		if got := hasCompletion(t, st, admin, id); got != want {
			t.Errorf("completion list of %s: %v, want %v", id, got, want)
		}
	}
	final, rec, _, err := st.Completed(ctx, c, "b")
	if err != nil {
		t.Fatal(err)
	}
	if final == nil || final.State != "done" || final.Finished != t0+20 || rec == nil {
		t.Fatalf("Completed(b) = %+v, %+v; want done at %d from the record", final, rec, t0+20)
	}
	if ttl, err := redis.Int(admin.Do("TTL", st.Keys.Waiter("b"))); err != nil || ttl <= 0 || ttl > WaiterTTL {
		t.Fatalf("waiter mark of b: ttl %d (%v); want one set by Completed, at most %d s", ttl, err, WaiterTTL)
	}
}

// TestCompletionWaiterMarksMidTransaction: a waiter that marks the task
// after the finish read the mark, before its EXEC, voids the transaction
// (the mark is watched); the retry reads the mark and pushes the list.
func TestCompletionWaiterMarksMidTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, st *Store, c redis.Conn) error
	}{
		{"Finish", func(ctx context.Context, st *Store, c redis.Conn) error {
			_, _, err := st.Finish(ctx, c, w1, "a", 1, t0+20, 600, func(*Record) Outcome { return Done })
			return err
		}},
		{"FinishGroup", func(ctx context.Context, st *Store, c redis.Conn) error {
			res, err := st.FinishGroup(ctx, c, w1, []FinishItem{{ID: "a", Run: 1, Now: t0 + 20, Decide: func(*Record) Outcome { return Done }}}, 600)
			if err == nil {
				err = res[0].Err
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, pool, admin := realStore(t)
			st.ResultTTL = 600
			ctx := testCtx(t)
			c := pool.Get()
			defer c.Close()
			if err := claimed("a")(ctx, st, c); err != nil {
				t.Fatal(err)
			}
			hc := &hookConn{Conn: pool.Get(), hook: func() error {
				_, err := admin.Do("SETEX", st.Keys.Waiter("a"), WaiterTTL, 1)
				return err
			}}
			defer hc.Close()
			if err := tc.run(ctx, st, hc); err != nil {
				t.Fatal(err)
			}
			if !hc.fired {
				t.Fatal("the hook never ran")
			}
			if !hasCompletion(t, st, admin, "a") {
				t.Fatal("no completion list: a mark set before EXEC was missed")
			}
		})
	}
}

// TestFinishHeldWaiterMarksDuringRun: a waiter that marks a task while it
// runs voids the claim's held watch, so the result is recorded the
// checked way, which reads the mark and pushes the list.
func TestFinishHeldWaiterMarksDuringRun(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	st.ResultTTL = 600
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := popped("a")(ctx, st, c); err != nil {
		t.Fatal(err)
	}
	var cs ClaimState
	rec, res, err := st.Claim(ctx, c, w1, "q", "a", t0+10, lease, true, &cs)
	if err != nil || res != Claimed || cs.Held() == nil || cs.Waited() {
		t.Fatalf("claim: %v, %v, held %v, waited %v", res, err, cs.Held(), cs.Waited())
	}
	if _, err := admin.Do("SETEX", st.Keys.Waiter("a"), WaiterTTL, 1); err != nil {
		t.Fatal(err)
	}
	done := func(*Record) Outcome { return Done }
	if _, _, _, err := st.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 600, done, nil); err != ErrWatchLost {
		t.Fatalf("FinishHeld = %v; want ErrWatchLost", err)
	}
	if _, _, err := st.Finish(ctx, c, w1, "a", 1, t0+20, 600, done); err != nil {
		t.Fatal(err)
	}
	if !hasCompletion(t, st, admin, "a") {
		t.Fatal("no completion list for a task marked while it ran")
	}
}

// TestClaimBatchWrongTypeRecord: a record key of another type, which MGET
// answers nil for as for a missing key, is set aside by the batch claim
// as a GET would find it, not overwritten as a missing record.
func TestClaimBatchWrongTypeRecord(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := popped("a", "b")(ctx, st, c); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("DEL", st.Keys.Task("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("RPUSH", st.Keys.Task("b"), "x"); err != nil {
		t.Fatal(err)
	}
	_, res, err := st.ClaimBatch(ctx, c, w1, "q", []string{"a", "b"}, t0+10, lease, make([]ClaimState, 2), false)
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != Claimed || res[1] != Buried {
		t.Fatalf("results %v; want [Claimed Buried]", res)
	}
	typ, err := redis.String(admin.Do("TYPE", st.Keys.Quarantine(st.Keys.Task("b"))))
	if err != nil || typ != "list" {
		t.Fatalf("set-aside key: %q (%v); want the list kept there", typ, err)
	}
}
