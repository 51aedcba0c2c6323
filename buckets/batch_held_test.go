package buckets

import (
	"errors"
	"slices"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// A batch claimed with hold leaves one watch, shared by its claimed runs,
// with each run's waiter mark as read; FinishGroupHeld records every
// result in one round trip without reading, pushing the completion list
// only for the task a waiter marked, and leaves nothing running.
func TestFinishGroupHeld(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	st.ResultTTL = 600
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := enqueued("a", "b", "c", "d")(ctx, st, c); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("SETEX", st.Keys.Waiter("b"), WaiterTTL, 1); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, st, c, 4)
	if err := st.Cancel(ctx, c, "d", t0+5, 60); err != nil {
		t.Fatal(err)
	}
	cs := make([]ClaimState, len(ids))
	recs, res, err := st.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, cs, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res, []ClaimResult{Claimed, Claimed, Claimed, Skipped}) {
		t.Fatalf("results %v", res)
	}
	held := cs[0].Held()
	if held == nil || cs[1].Held() != held || cs[2].Held() != held || cs[3].Held() != nil {
		t.Fatalf("held watches %v %v %v %v; want one shared by the claimed runs", cs[0].Held(), cs[1].Held(), cs[2].Held(), cs[3].Held())
	}
	if cs[0].Waited() || !cs[1].Waited() || cs[2].Waited() {
		t.Fatalf("waited %v %v %v; want only b", cs[0].Waited(), cs[1].Waited(), cs[2].Waited())
	}
	done := func(*Record) Outcome { return Done }
	items := make([]HeldItem, 3)
	for i := range items {
		items[i] = HeldItem{Rec: recs[i], Waited: cs[i].Waited(), Now: t0 + 20, Decide: done}
	}
	fr, _, err := st.FinishGroupHeld(ctx, held, w1, items, 600, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range fr {
		if r.Err != nil || r.Out != Done || r.Rec == nil || r.Rec.State != StateDone || r.Rec.Finished != t0+20 {
			t.Errorf("result %d: %+v", i, r)
		}
		if recs[i].State != StateRunning {
			t.Errorf("the claimed record %d was changed: %+v", i, recs[i])
		}
		if rec := mustRecord(t, ctx, st, admin, ids[i]); rec.State != StateDone {
			t.Errorf("record %s: %+v; want done", ids[i], rec)
		}
	}
	if hasCompletion(t, st, admin, "a") || !hasCompletion(t, st, admin, "b") || hasCompletion(t, st, admin, "c") {
		t.Error("completion lists: want one for b alone")
	}
	if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Pending(w1))); n != 0 {
		t.Errorf("%d pending after the group", n)
	}
	if n, _ := redis.Int(admin.Do("HGET", st.Keys.Stats("q"), StatRunning)); n != 0 {
		t.Errorf("running gauge %d after the group", n)
	}
	if n, _ := redis.Int(admin.Do("HGET", st.Keys.Stats("q"), StatProcessed)); n != 3 {
		t.Errorf("processed %d, want 3", n)
	}
}

// A record changed while its run went on (here: a waiter marks it, as
// one that starts waiting would) voids the whole held group: nothing is
// written, ErrWatchLost; FinishGroup then records every result, the
// changed run's with its completion list. A group of some of the batch's
// runs uses the watch up: the rest are recorded with FinishGroup.
func TestFinishGroupHeldWatchLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change bool // mark b while the runs go on
		some   int  // runs recorded held (the rest after, with FinishGroup)
	}{{"changed", true, 3}, {"some", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			st, pool, admin := realStore(t)
			st.ResultTTL = 600
			ctx := testCtx(t)
			c := pool.Get()
			defer c.Close()
			if err := enqueued("a", "b", "c")(ctx, st, c); err != nil {
				t.Fatal(err)
			}
			ids := popAll(t, st, c, 3)
			cs := make([]ClaimState, len(ids))
			recs, _, err := st.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, cs, true)
			if err != nil || cs[0].Held() == nil {
				t.Fatalf("claim: %v, held %v", err, cs[0].Held())
			}
			if tc.change {
				if _, err := admin.Do("SETEX", st.Keys.Waiter("b"), WaiterTTL, 1); err != nil {
					t.Fatal(err)
				}
			}
			done := func(*Record) Outcome { return Done }
			var items []HeldItem
			for i := range tc.some {
				items = append(items, HeldItem{Rec: recs[i], Waited: cs[i].Waited(), Now: t0 + 20, Decide: done})
			}
			_, _, err = st.FinishGroupHeld(ctx, cs[0].Held(), w1, items, 600, nil)
			rest := 0
			if tc.change {
				if !errors.Is(err, ErrWatchLost) {
					t.Fatalf("FinishGroupHeld = %v; want ErrWatchLost", err)
				}
				if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Pending(w1))); n != 3 {
					t.Fatalf("%d pending after a voided group; want all 3 still running", n)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				rest = tc.some
			}
			var fi []FinishItem
			for i := rest; i < len(ids); i++ {
				fi = append(fi, FinishItem{ID: ids[i], Run: recs[i].Runs, Now: t0 + 30, Decide: done})
			}
			fr, err := st.FinishGroup(ctx, c, w1, fi, 600)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range fr {
				if r.Err != nil || r.Out != Done {
					t.Errorf("checked result %d: %+v", i, r)
				}
			}
			for _, id := range ids {
				if rec := mustRecord(t, ctx, st, admin, id); rec.State != StateDone {
					t.Errorf("record %s: %+v; want done", id, rec)
				}
			}
			if tc.change && !hasCompletion(t, st, admin, "b") {
				t.Error("no completion list for the task marked while it ran")
			}
			if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Pending(w1))); n != 0 {
				t.Errorf("%d pending at the end", n)
			}
		})
	}
}
