package buckets

import (
	"fmt"
	"testing"

	"github.com/gomodule/redigo/redis"
)

func TestPlanSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, chunk, want int }{
		{1, 128, 4},      // one transaction
		{7, 128, 4},      // two, of 4 and 3
		{101, 128, 4},    // a burst: 26 transactions of whole buckets
		{128, 128, 4},    // 32 of 4
		{129, 128, 128},  // more than one transaction's worth: chunk
		{1024, 128, 128}, // a full lookahead of a spread backlog
		{200, 16, 16},    // chunk bounds it
		{10, 2, 2},       // ... even below minPlanBuckets
		{1000, 2000, 32}, // 1000 buckets in 32 transactions (31 of 32, one of 8)
		{0, 128, 4},      // nothing read: no plan is made
	} {
		if got := planSize(c.n, c.chunk); got != c.want {
			t.Errorf("planSize(%d, %d) = %d; want %d", c.n, c.chunk, got, c.want)
		}
	}
}

// A backlog of a few large buckets, each of which fits the task bound of a
// transaction: one MoveDue deals the buckets out to several transactions on
// both connections and moves every bucket whole, where one transaction for
// all of them would give each bucket a share of 100/40 = 2 ids and leave
// them to later rounds.
func TestMoveDueSpreadsFewLargeBuckets(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	const buckets, per = 40, 10
	for b := range buckets {
		var recs []*Record
		due := t0 - 100_000 + int64(b)*max(st.Resolution, 1)
		for i := range per {
			recs = append(recs, newRec(fmt.Sprintf("t%d-%d", b, i), due))
		}
		if err := st.Enqueue(ctx, conn, t0-200_000, recs); err != nil {
			t.Fatal(err)
		}
	}
	lanes := []*cmdCounter{{Conn: pool.Get(), n: map[string]int{}}, {Conn: pool.Get(), n: map[string]int{}}}
	defer lanes[0].Close()
	defer lanes[1].Close()
	res, err := st.MoveDue(ctx, []redis.Conn{lanes[0], lanes[1]}, MoveOpts{Now: t0, Chunk: 128, MaxTasks: 100, Lookahead: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks != buckets*per || res.Buckets != buckets || res.Partial || res.Conflicts != 0 {
		t.Fatalf("MoveDue = %+v; want all %d tasks of %d buckets moved whole", res, buckets*per, buckets)
	}
	if n, err := redis.Int(admin.Do("LLEN", st.Keys.Ready("q"))); err != nil || n != buckets*per {
		t.Fatalf("ready list holds %d (%v); want %d", n, err, buckets*per)
	}
	if n, err := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); err != nil || n != 0 {
		t.Fatalf("index holds %d members (%v); want none", n, err)
	}
	// 40 buckets, 4 a transaction: 10 transactions, dealt to both lanes.
	if e0, e1 := lanes[0].n["EXEC"], lanes[1].n["EXEC"]; e0+e1 != 10 || e0 == 0 || e1 == 0 {
		t.Fatalf("EXECs per lane = %d, %d; want 10 in all, on both", e0, e1)
	}
}

// MoveDue asks its gate before moving a full window, and moves nothing
// when the gate says no; a window that is not full moves without asking.
func TestMoveDueGate(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	const buckets = 20
	for b := range buckets {
		due := t0 - 100_000 + int64(b)*max(st.Resolution, 1)
		if err := st.Enqueue(ctx, conn, t0-200_000, []*Record{newRec(fmt.Sprintf("t%d", b), due)}); err != nil {
			t.Fatal(err)
		}
	}
	asked := 0
	no := func() (bool, error) { asked++; return false, nil }
	res, err := st.MoveDue(ctx, []redis.Conn{conn}, MoveOpts{Now: t0, Chunk: 4, MaxTasks: 100, Lookahead: 16, Gate: no})
	if err != nil || !res.Gated || !res.WindowFull || res.Tasks != 0 || asked != 1 {
		t.Fatalf("MoveDue over a full window, gate saying no = %+v, %v (asked %d); want gated, nothing moved, asked once", res, err, asked)
	}
	if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); n != buckets {
		t.Fatalf("index holds %d members after a gated call; want %d", n, buckets)
	}
	yes := func() (bool, error) { asked++; return true, nil }
	res, err = st.MoveDue(ctx, []redis.Conn{conn}, MoveOpts{Now: t0, Chunk: 4, MaxTasks: 100, Lookahead: 16, Gate: yes})
	if err != nil || res.Gated || res.Tasks != 16 || asked != 2 {
		t.Fatalf("MoveDue over a full window, gate saying yes = %+v, %v (asked %d); want 16 moved", res, err, asked)
	}
	res, err = st.MoveDue(ctx, []redis.Conn{conn}, MoveOpts{Now: t0, Chunk: 4, MaxTasks: 100, Lookahead: 16, Gate: no})
	if err != nil || res.Gated || res.Tasks != 4 || asked != 2 {
		t.Fatalf("MoveDue over the last 4 buckets = %+v, %v (asked %d); want 4 moved without asking", res, err, asked)
	}
}
