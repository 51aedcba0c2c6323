package buckets

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// fixedID is an inlineable id made at t0 whose random bits are n: the same
// in every run.
func fixedID(n uint32) string {
	var b [16]byte
	ms := t0
	binary.BigEndian.PutUint16(b[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	binary.BigEndian.PutUint32(b[12:16], n)
	return EncodeID(b)
}

func TestParseIndexMember(t *testing.T) {
	t.Parallel()
	id := fixedID(7)
	for _, c := range []struct {
		m      string
		q      string
		ts     int64
		id     string
		broken bool
	}{
		{m: "q:1700000000000", q: "q", ts: 1_700_000_000_000},
		{m: "default:0", q: "default", ts: 0},
		{m: "q:" + id, q: "q", id: id},
		{m: "q:" + id + "~3", q: "q", id: id + "~3"},
		{m: "a.b-c:" + id, q: "a.b-c", id: id},
		{m: "q:" + id[:21], broken: true},  // too short for an id, not a number
		{m: "q:" + id + "x", broken: true}, // a 23rd digit
		// 22 digits that a bucket time's parse would take (leading zeros)
		// but with a time in their top bits: an id. No bucket member has
		// 22 digits (Member writes at most 19, no leading zero).
		{m: "q:0000011234567890123456", q: "q", id: "0000011234567890123456"},
		{m: "q:0000000000000000000001", q: "q", ts: 1}, // no time in it: not an id
		{m: "bad name:" + id, broken: true},
		{m: ":" + id, broken: true},
		{m: id, broken: true},
		{m: "q:-5", broken: true},
	} {
		q, ts, gotID, err := ParseIndexMember(c.m)
		if c.broken {
			if err == nil {
				t.Errorf("ParseIndexMember(%q) = %q, %d, %q; want an error", c.m, q, ts, gotID)
			}
			continue
		}
		if err != nil || q != c.q || ts != c.ts || gotID != c.id {
			t.Errorf("ParseIndexMember(%q) = %q, %d, %q, %v; want %q, %d, %q", c.m, q, ts, gotID, err, c.q, c.ts, c.id)
		}
	}
	// An inline member is no longer than a bucket's with a 13-digit time
	// for a generated id and the default queue: both fit one allocation
	// class of Redis's strings (up to 30 bytes).
	if m := InlineMember("default", id); len(m) != 30 {
		t.Errorf("inline member %q is %d bytes; want 30", m, len(m))
	}
}

// GuardOf is part of the data format: every process must pick the same
// guard for an id, whatever its release.
func TestGuardOfIsFixed(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]int{"": 5, "a": 12, "0D5RrEVvtJMhKIrvTU2JzN": 11, fixedID(1): GuardOf(fixedID(1))} {
		if got := GuardOf(id); got != want {
			t.Errorf("GuardOf(%q) = %d; want %d", id, got, want)
		}
	}
	seen := map[int]bool{}
	for n := range uint32(1000) {
		g := GuardOf(fixedID(n))
		if g < 0 || g >= Guards {
			t.Fatalf("GuardOf = %d; want 0 to %d", g, Guards-1)
		}
		seen[g] = true
	}
	if len(seen) != Guards {
		t.Fatalf("1000 ids use %d guards; want all %d", len(seen), Guards)
	}
}

// A delayed task alone in its bucket is scheduled inline: one index entry
// naming it, no bucket list; tasks enqueued together for one bucket, and
// ids that are not of the generated shape, keep a list. MoveDue moves both
// kinds, in due order, and the gauges end at zero.
func TestInlineEnqueueAndMove(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	a, b, c, d := fixedID(1), fixedID(2), fixedID(3), fixedID(4)
	// a alone (Enqueue of one), b alone in a batch, c and d together,
	// "chosen" alone but not inlineable.
	if err := st.Enqueue(ctx, conn, t0, []*Record{newRec(a, t0+1000)}); err != nil {
		t.Fatal(err)
	}
	if err := st.Enqueue(ctx, conn, t0, []*Record{newRec(b, t0+2000), newRec(c, t0+3000), newRec(d, t0+3000), newRec("chosen", t0+4000)}); err != nil {
		t.Fatal(err)
	}
	members, err := redis.Strings(admin.Do("ZRANGE", st.Keys.Schedule(), 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{InlineMember("q", a), InlineMember("q", b), Member("q", t0+3000), Member("q", t0+4000)}
	if fmt.Sprint(members) != fmt.Sprint(want) {
		t.Fatalf("index = %v; want %v", members, want)
	}
	for _, ts := range []int64{t0 + 1000, t0 + 2000} {
		if n, _ := redis.Int(admin.Do("EXISTS", st.Keys.Bucket("q", ts))); n != 0 {
			t.Fatalf("bucket list at %d exists; an inline task has none", ts)
		}
	}
	if n, _ := redis.Int(admin.Do("HGET", st.Keys.Stats("q"), StatScheduled)); n != 5 {
		t.Fatalf("scheduled gauge %d; want 5", n)
	}
	c2 := pool.Get()
	defer c2.Close()
	res, err := st.MoveDue(ctx, []redis.Conn{conn, c2}, MoveOpts{Now: t0 + 5000, Chunk: 128, MaxTasks: 100, Lookahead: 1024})
	if err != nil || res.Tasks != 5 || res.Buckets != 4 || res.Conflicts != 0 || res.Stale != 0 {
		t.Fatalf("MoveDue = %+v, %v; want 5 tasks of 4 members", res, err)
	}
	ready, _ := redis.Strings(admin.Do("LRANGE", st.Keys.Ready("q"), 0, -1))
	sort.Strings(ready)
	wantReady := []string{a, b, c, d, "chosen"}
	sort.Strings(wantReady)
	if fmt.Sprint(ready) != fmt.Sprint(wantReady) {
		t.Fatalf("ready = %v; want %v", ready, wantReady)
	}
	if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); n != 0 {
		t.Fatalf("index holds %d members; want none", n)
	}
	if n, _ := redis.Int(admin.Do("HGET", st.Keys.Stats("q"), StatScheduled)); n != 0 {
		t.Fatalf("scheduled gauge %d after the move; want 0", n)
	}
	// Each moved inline entry bumped its guard once.
	bumps := 0
	for g := range Guards {
		n, _ := redis.Int(admin.Do("GET", st.Keys.Guard(g)))
		bumps += n
	}
	if bumps != 2 {
		t.Fatalf("guards bumped %d times; want 2 (one per inline entry moved)", bumps)
	}
}

// An inline entry named to Move but no longer in the index (another
// transaction took it) is stale: nothing is pushed and no guard bumped.
func TestInlineMoveOfAGoneEntry(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	res, err := st.Move(ctx, conn, []string{InlineMember("q", fixedID(9))}, 100)
	if err != nil || res.Tasks != 0 || res.Stale != 1 {
		t.Fatalf("Move of a gone entry = %+v, %v; want 1 stale, nothing moved", res, err)
	}
	if n, _ := redis.Int(admin.Do("EXISTS", st.Keys.Ready("q"))); n != 0 {
		t.Fatal("a gone entry's id was pushed")
	}
	if n, _ := redis.Int(admin.Do("EXISTS", st.Keys.Guard(GuardOf(fixedID(9))))); n != 0 {
		t.Fatal("a gone entry's guard was bumped")
	}
}

// Dispatchers racing over the same inline entries move each exactly once:
// every id reaches the ready list once, and the scheduled gauge ends at 0.
func TestInlineMoveRace(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	const n = 600
	var recs []*Record
	for i := range n {
		recs = append(recs, newRec(fixedID(uint32(i)), t0+1000+int64(i)*1000))
	}
	// One enqueue per task: each is alone in its bucket, so inline.
	for _, r := range recs {
		if err := st.Enqueue(ctx, conn, t0, []*Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := redis.Int(admin.Do("EXISTS", st.Keys.Bucket("q", t0+1000))); n != 0 {
		t.Fatal("a bucket list was written for a task alone in its bucket")
	}
	now := t0 + 1000 + n*1000
	var wg sync.WaitGroup
	var mu sync.Mutex
	moved, conflicts := 0, 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := []redis.Conn{pool.Get(), pool.Get()}
			defer cs[0].Close()
			defer cs[1].Close()
			for {
				res, err := st.MoveDue(context.Background(), cs, MoveOpts{Now: now, Chunk: 16, MaxTasks: 100, Lookahead: 128})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				moved += res.Tasks
				conflicts += res.Conflicts
				mu.Unlock()
				if res.Tasks == 0 && res.Conflicts == 0 && !res.Partial {
					return
				}
			}
		}()
	}
	wg.Wait()
	ready, _ := redis.Strings(admin.Do("LRANGE", st.Keys.Ready("q"), 0, -1))
	count := map[string]int{}
	for _, id := range ready {
		count[id]++
	}
	for _, r := range recs {
		if count[r.ID] != 1 {
			t.Fatalf("task %s is %d times in the ready list; want once", r.ID, count[r.ID])
		}
	}
	if moved != n || len(ready) != n {
		t.Fatalf("moved %d, ready %d; want %d", moved, len(ready), n)
	}
	if g, _ := redis.Int(admin.Do("HGET", st.Keys.Stats("q"), StatScheduled)); g != 0 {
		t.Fatalf("scheduled gauge %d; want 0", g)
	}
	t.Logf("%d conflicts among 4 dispatchers of 2 lanes", conflicts)
}

// A move of inline entries whose EXEC ran unseen while its push failed on
// a ready list of the wrong type: the entries are gone from the index, so
// SettleMove places their tasks; had the EXEC not run, the entries would
// still be there and it would push nothing.
func TestInlineSettleMove(t *testing.T) {
	t.Parallel()
	for _, ran := range []bool{true, false} {
		t.Run(fmt.Sprintf("exec ran %v", ran), func(t *testing.T) {
			st, pool, admin := realStore(t)
			ctx := testCtx(t)
			conn := pool.Get()
			defer conn.Close()
			ids := []string{fixedID(1), fixedID(2)}
			for i, id := range ids {
				if err := st.Enqueue(ctx, conn, t0-60_000, []*Record{newRec(id, t0-5000+int64(i)*1000)}); err != nil {
					t.Fatal(err)
				}
			}
			ready := st.Keys.Ready("q")
			hc := &hookConn{Conn: pool.Get(), hook: stringTrap(admin, ready, "not a list")}
			cc := &crashConn{inner: hc, at: "EXEC", after: ran}
			defer cc.Close()
			res, err := st.MoveDue(ctx, []redis.Conn{cc}, MoveOpts{Now: t0, Chunk: 16, MaxTasks: 100, Lookahead: 128})
			if !errors.Is(err, errCrash) || len(res.Uncertain) != 1 {
				t.Fatalf("MoveDue = %+v, %v; want the injected crash and one uncertain move", res, err)
			}
			mb := res.Uncertain[0].Buckets
			if len(mb) != 2 {
				t.Fatalf("uncertain move = %+v; want the two inline entries", mb)
			}
			for i, b := range mb {
				if !b.Inline || b.Member != InlineMember("q", ids[i]) || !slices.Equal(b.IDs, ids[i:i+1]) || b.Key != st.Keys.Guard(GuardOf(ids[i])) {
					t.Fatalf("uncertain entry %d = %+v; want the inline entry of %s", i, b, ids[i])
				}
			}
			fresh := pool.Get()
			defer fresh.Close()
			sr, err := st.SettleMove(ctx, fresh, res.Uncertain[0])
			if err != nil {
				t.Fatal(err)
			}
			index, _ := redis.Int(admin.Do("ZCARD", st.Keys.Schedule()))
			if ran {
				if sr.Pushed != 2 || index != 0 {
					t.Fatalf("SettleMove after an EXEC that ran = %+v (index %d); want both pushed, index empty", sr, index)
				}
				got, _ := redis.Strings(admin.Do("LRANGE", ready, 0, -1))
				slices.Sort(got)
				want := slices.Sorted(slices.Values(ids))
				if !slices.Equal(got, want) {
					t.Fatalf("ready = %v; want %v", got, want)
				}
				return
			}
			if sr.Pushed != 0 || index != 2 {
				t.Fatalf("SettleMove after an EXEC that did not run = %+v (index %d); want nothing pushed, both entries left", sr, index)
			}
		})
	}
}

// checkClean runs the namespace check and fails on any finding.
func checkClean(t *testing.T, st *Store, conn redis.Conn, when string) *CheckReport {
	t.Helper()
	rep, err := st.CheckNamespace(testCtx(t), conn, CheckOptions{ListKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings)+len(rep.Unconfirmed) > 0 {
		t.Fatalf("check %s: %+v %+v", when, rep.Findings, rep.Unconfirmed)
	}
	return rep
}

// The paths that find a scheduled task by its record find it in its
// inline entry: Lookup, Cancel, Act (run, cancel, delete), the queue's
// next due time, a listing of its scheduled tasks, and the namespace
// check, which counts inline entries in the scheduled gauge and tells a
// task in no place.
func TestInlineReaders(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	ids := []string{fixedID(1), fixedID(2), fixedID(3), fixedID(4), fixedID(5)}
	for i, id := range ids {
		if err := st.Enqueue(ctx, conn, t0, []*Record{newRec(id, t0+int64(1+i)*60_000)}); err != nil {
			t.Fatal(err)
		}
	}
	// A second task for the bucket of ids[0] goes to the bucket's list.
	if err := st.Enqueue(ctx, conn, t0, []*Record{newRec(fixedID(6), t0+60_000)}); err != nil {
		t.Fatal(err)
	}
	if n, _ := redis.Int(admin.Do("LLEN", st.Keys.Bucket("q", t0+60_000))); n != 1 {
		t.Fatalf("bucket list of the first time holds %d; want the second task", n)
	}
	rep := checkClean(t, st, conn, "after enqueue")
	if rep.Tasks != 6 {
		t.Fatalf("check saw %d tasks; want 6", rep.Tasks)
	}
	// Lookup and Stats.
	if _, where, err := st.Lookup(ctx, conn, ids[1]); err != nil || where != InBucket {
		t.Fatalf("Lookup = %v, %v; want InBucket", where, err)
	}
	qs, err := st.Stats(ctx, conn, 100)
	if err != nil || len(qs) != 1 || qs[0].NextDue != t0+60_000 || qs[0].Scheduled != 6 {
		t.Fatalf("Stats = %+v, %v; want next due %d and 6 scheduled", qs, err, t0+60_000)
	}
	// A listing: times once each, the first time's window holds the
	// inline task then the list's.
	ats, _, _, err := st.BucketTimes(ctx, conn, "q", 0, 64)
	if err != nil || len(ats) != 5 || ats[0].Ts != t0+60_000 || !ats[0].List || fmt.Sprint(ats[0].Inline) != fmt.Sprint(ids[:1]) ||
		ats[1].List || fmt.Sprint(ats[1].Inline) != fmt.Sprint(ids[1:2]) || ats[4].Partial {
		t.Fatalf("BucketTimes = %+v, %v; want the 5 times", ats, err)
	}
	// Read with what BucketTimes read, and without (At nil: all read).
	want := fmt.Sprint([][]string{{ids[0], fixedID(6)}, {fixedID(6)}, {ids[1]}, {}})
	for _, with := range []bool{true, false} {
		rs := []BucketRange{{Ts: t0 + 60_000, Lo: 0, Hi: 9, At: &ats[0]}, {Ts: t0 + 60_000, Lo: 1, Hi: 9, At: &ats[0]},
			{Ts: t0 + 120_000, Lo: 0, Hi: 0, At: &ats[1]}, {Ts: t0 + 120_000, Lo: 1, Hi: 5, At: &ats[1]}}
		if !with {
			for i := range rs {
				rs[i].At = nil
			}
		}
		ws, err := st.BucketWindows(ctx, conn, "q", rs)
		if err != nil || fmt.Sprint(ws) != want {
			t.Fatalf("BucketWindows (with BucketTimes's reads: %v) = %v, %v; want %v", with, ws, err, want)
		}
	}
	// A read that ends among a time's members says so.
	if ats, _, more, err := st.BucketTimes(ctx, conn, "q", 0, 2); err != nil || !more || len(ats) != 1 || !ats[0].Partial {
		t.Fatalf("BucketTimes of 2 members = %+v, %v, %v; want the first time, partial", ats, more, err)
	}
	if ok, err := st.BucketIndexed(ctx, conn, "q", t0+180_000); err != nil || !ok {
		t.Fatalf("BucketIndexed of an inline entry's time = %v, %v; want true", ok, err)
	}
	// Cancel one, act on three.
	if err := st.Cancel(ctx, conn, ids[1], t0, 3600); err != nil {
		t.Fatal(err)
	}
	if n, _ := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); n != 5 {
		t.Fatalf("index holds %d after a cancel; want 5", n)
	}
	if _, err := st.Act(ctx, conn, ActRun, []string{ids[2]}, t0, 3600, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Act(ctx, conn, ActCancel, []string{ids[3]}, t0, 3600, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := st.Act(ctx, conn, ActDelete, []string{ids[4], ids[4]}, t0, 3600, nil); err != nil || res.Done != 1 {
		t.Fatalf("Act delete = %+v, %v", res, err)
	}
	ready, _ := redis.Strings(admin.Do("LRANGE", st.Keys.Ready("q"), 0, -1))
	if fmt.Sprint(ready) != fmt.Sprint([]string{ids[2]}) {
		t.Fatalf("ready = %v; want the task run now", ready)
	}
	members, _ := redis.Strings(admin.Do("ZRANGE", st.Keys.Schedule(), 0, -1))
	if fmt.Sprint(members) != fmt.Sprint([]string{InlineMember("q", ids[0]), Member("q", t0+60_000)}) {
		t.Fatalf("index = %v; want the first time's entry and list", members)
	}
	checkClean(t, st, conn, "after cancel and acts")
	// A task whose inline entry is lost is homeless; repair places it.
	if _, err := admin.Do("ZREM", st.Keys.Schedule(), InlineMember("q", ids[0])); err != nil {
		t.Fatal(err)
	}
	rep, err = st.CheckNamespace(ctx, conn, CheckOptions{ListKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	var homeless, gauge int
	for _, f := range rep.Findings {
		switch {
		case f.Kind == FindHomeless && f.ID == ids[0]:
			homeless++
		case f.Kind == FindGauge && f.Gauge == StatScheduled:
			gauge++
		default:
			t.Errorf("finding %+v", f)
		}
	}
	if homeless != 1 || gauge != 1 {
		t.Fatalf("check after losing an entry: %+v; want the task homeless and the scheduled gauge off", rep.Findings)
	}
	for _, f := range rep.Findings {
		if _, err := st.Repair(ctx, conn, CheckOptions{}, f, t0); err != nil {
			t.Fatal(err)
		}
	}
	checkClean(t, st, conn, "after repair")
}
