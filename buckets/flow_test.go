package buckets

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// keyedRecs returns waiting records of queue q due at t0, id i with key
// keys[i].
func keyedRecs(ids, keys []string) []*Record {
	var recs []*Record
	for i, id := range ids {
		r := newRec(id, t0)
		r.Key = keys[i]
		recs = append(recs, r)
	}
	return recs
}

// A keyed task waits in its key's list and puts its key in turn; a pop
// takes keys in turn, least recently served first, and takes a key out
// of turn when it empties its list.
func TestKeysRoundRobin(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	// Key "big" has three tasks, "small" one, enqueued after big's.
	if err := s.Enqueue(ctx, c, t0, keyedRecs([]string{"b1", "b2", "b3", "s1"}, []string{"big", "big", "big", "small"})); err != nil {
		t.Fatal(err)
	}
	if n, _ := redis.Int(c.Do("LLEN", s.Keys.Ready("q#big"))); n != 3 {
		t.Fatalf("q:q#big holds %d, want 3", n)
	}
	if ok, _ := redis.Bool(c.Do("SISMEMBER", s.Keys.Levels(), "q#")); !ok {
		t.Fatal("the levels set does not name q's keyed tasks (q#)")
	}
	lv, err := s.Levels(ctx, c)
	if err != nil || !slices.Equal(lv["q"], []string{"q#"}) {
		t.Fatalf("levels %v, %v; want q: [q#]", lv, err)
	}
	var got []string
	now := t0 + 10
	for i := 0; i < 4; i++ {
		kp, ids, _, err := s.PopKey(ctx, c, "q", w1, 1, now+int64(i))
		if err != nil || len(ids) != 1 {
			t.Fatalf("pop %d: %s %v %v", i, kp, ids, err)
		}
		if _, key := SplitKey(kp); key != (map[bool]string{true: "big", false: "small"})[ids[0][0] == 'b'] {
			t.Fatalf("pop %d: %s from place %s", i, ids[0], kp)
		}
		got = append(got, ids[0])
	}
	// Both keys start at 0; the one served first goes behind the other.
	if !(slices.Equal(got, []string{"b1", "s1", "b2", "b3"}) || slices.Equal(got, []string{"s1", "b1", "b2", "b3"})) {
		t.Fatalf("order %v: small's task must come within one of big's", got)
	}
	if n, _ := redis.Int(c.Do("ZCARD", s.Keys.Rotation("q"))); n != 0 {
		t.Fatalf("%d keys in turn after every list emptied, want 0", n)
	}
	if _, ids, next, err := s.PopKey(ctx, c, "q", w1, 1, now+10); err != nil || len(ids) != 0 || next != 0 {
		t.Fatalf("pop of nothing: %v %d %v", ids, next, err)
	}
}

// A key's concurrency limit: a claim past it gives the task back to the
// front of its key's list and puts the key out of turn; the result gives
// the slot back and puts the key in turn at once.
func TestKeyMaxRunning(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	lim := Limits{KeyMaxRunning: 1}
	if err := s.SetQueueLimits(ctx, c, "q", lim); err != nil {
		t.Fatal(err)
	}
	if err := s.Enqueue(ctx, c, t0, keyedRecs([]string{"a", "b", "x"}, []string{"k", "k", "other"})); err != nil {
		t.Fatal(err)
	}
	claim := func(kp, id string, now int64) (*Record, ClaimResult, int64) {
		t.Helper()
		cs := &ClaimState{Limits: lim}
		r, res, err := s.Claim(ctx, c, w1, kp, id, now, lease, false, cs)
		if err != nil {
			t.Fatal(err)
		}
		return r, res, cs.Until
	}
	if _, err := c.Do("RPOPLPUSH", s.Keys.Ready("q#k"), s.Keys.Inflight(w1)); err != nil {
		t.Fatal(err)
	}
	r, res, _ := claim("q#k", "a", t0+10)
	if res != Claimed || !r.HoldsKeySlot {
		t.Fatalf("first of key k: %v %+v", res, r)
	}
	if _, err := c.Do("RPOPLPUSH", s.Keys.Ready("q#k"), s.Keys.Inflight(w1)); err != nil {
		t.Fatal(err)
	}
	if _, res, _ := claim("q#k", "b", t0+20); res != KeyFull {
		t.Fatalf("second of key k: %v, want KeyFull", res)
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatHeld)); n != 1 {
		t.Fatalf("held %d, want 1 (the task given back)", n)
	}
	if ids, _ := redis.Strings(c.Do("LRANGE", s.Keys.Ready("q#k"), 0, -1)); !slices.Equal(ids, []string{"b"}) {
		t.Fatalf("q:q#k holds %v, want [b] back", ids)
	}
	if sc, err := c.Do("ZSCORE", s.Keys.Rotation("q"), "k"); sc != nil || err != nil {
		t.Fatalf("key k in turn (%v, %v) while its slot is in use; want it out of turn", sc, err)
	}
	checkClean(t, s, c, "a full key out of turn")
	// Another key is not held back.
	if _, err := c.Do("RPOPLPUSH", s.Keys.Ready("q#other"), s.Keys.Inflight(w1)); err != nil {
		t.Fatal(err)
	}
	if _, res, _ := claim("q#other", "x", t0+30); res != Claimed {
		t.Fatalf("key other: %v, want Claimed", res)
	}
	if _, _, err := s.Finish(ctx, c, w1, "a", 1, t0+40, 60, func(*Record) Outcome { return Done }); err != nil {
		t.Fatal(err)
	}
	if n, _ := redis.Int(c.Do("SCARD", s.Keys.KeySlots("q", "k"))); n != 0 {
		t.Fatalf("key k holds %d slots after its task ended, want 0", n)
	}
	if sc, _ := redis.Int64(c.Do("ZSCORE", s.Keys.Rotation("q"), "k")); sc != t0+40 {
		t.Fatalf("key k in turn at %d after the release, want %d (at once)", sc, t0+40)
	}
	kp, ids, _, err := s.PopKey(ctx, c, "q", w1, 1, t0+50)
	if err != nil || kp != "q#k" || !slices.Equal(ids, []string{"b"}) {
		t.Fatalf("pop after the release: %s %v %v", kp, ids, err)
	}
	if _, res, _ := claim(kp, "b", t0+50); res != Claimed {
		t.Fatalf("b after a's release: %v", res)
	}
}

// A rate is a sliding window over claims: N start in any window of the
// period, the next one is given back until the oldest of them leaves
// the window.
func TestQueueRate(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	lim := Limits{Rate: Rate{N: 2, Per: time.Minute}}
	if err := s.SetQueueLimits(ctx, c, "q", lim); err != nil {
		t.Fatal(err)
	}
	if err := enqueued("a", "b", "c")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	claim := func(id string, now int64) (ClaimResult, int64) {
		t.Helper()
		if _, err := s.Pop(ctx, c, "q", w1); err != nil {
			t.Fatal(err)
		}
		cs := &ClaimState{Limits: lim}
		_, res, err := s.Claim(ctx, c, w1, "q", id, now, lease, false, cs)
		if err != nil {
			t.Fatal(err)
		}
		return res, cs.Until
	}
	if res, _ := claim("a", t0+10); res != Claimed {
		t.Fatal(res)
	}
	if res, _ := claim("b", t0+20); res != Claimed {
		t.Fatal(res)
	}
	if res, until := claim("c", t0+30); res != Throttled || until != t0+10+60_000 {
		t.Fatalf("third within the minute: %v until %d, want Throttled until %d", res, until, t0+60_010)
	}
	if res, until := claim("c", t0+60_009); res != Throttled || until != t0+60_010 {
		t.Fatalf("1 ms before the window opens: %v until %d", res, until)
	}
	if res, _ := claim("c", t0+60_010); res != Claimed {
		t.Fatalf("when the first start leaves the window: %v", res)
	}
	if n, _ := redis.Int(c.Do("LLEN", s.Keys.RateLog("q"))); n != 2 {
		t.Fatalf("the start log holds %d, want 2 (trimmed to N)", n)
	}
	// A count changed since the worker's view is read again under the
	// same watch: a view of N=5 claims against the stored N=2.
	if err := enqueued("d")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pop(ctx, c, "q", w1); err != nil {
		t.Fatal(err)
	}
	cs := &ClaimState{Limits: Limits{Rate: Rate{N: 5, Per: time.Minute}}}
	if _, res, err := s.Claim(ctx, c, w1, "q", "d", t0+60_015, lease, false, cs); err != nil || res != Throttled {
		t.Fatalf("stale view: %v %v, want Throttled", res, err)
	}
}

// ParseRate reads N/period and refuses the rest with ErrInvalidLimit.
func TestParseRate(t *testing.T) {
	t.Parallel()
	if r, err := ParseRate("10/1s"); err != nil || r != (Rate{10, time.Second}) || r.String() != "10/1s" {
		t.Fatalf("10/1s: %v %v", r, err)
	}
	if r, err := ParseRate(""); err != nil || r.N != 0 {
		t.Fatalf("empty: %v %v", r, err)
	}
	for _, bad := range []string{"10", "0/1s", "-1/1s", "x/1s", "10/0s", "10/25h", "10/1", "10/1s/2"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	_ = context.Background
}

// The check finds a key's list out of turn and a key slot held by no
// run (which would hold the key back for good), and repairs both: the
// key comes in turn again, and the slot is given back.
func TestCheckKeys(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	ctx := testCtx(t)
	now := time.Now().UnixMilli()
	r := newRec("a", now)
	r.Key = "k"
	if err := st.Enqueue(ctx, conn, now, []*Record{r}); err != nil {
		t.Fatal(err)
	}
	checkClean(t, st, conn, "a keyed task waiting")
	if _, err := admin.Do("ZREM", st.Keys.Rotation("q"), "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("SADD", st.Keys.KeySlots("q", "k"), "ghost"); err != nil {
		t.Fatal(err)
	}
	rep, err := st.CheckNamespace(ctx, conn, CheckOptions{ListKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[FindingKind]Finding{}
	for _, f := range rep.Findings {
		kinds[f.Kind] = f
	}
	if len(rep.Findings) != 2 || kinds[FindUnturnedKey].Member != "q#k" || kinds[FindKeySlots].Stored != 1 || kinds[FindKeySlots].Count != 0 {
		t.Fatalf("findings %v; want the key out of turn and one slot held by no run", rep.Findings)
	}
	for _, f := range rep.Findings {
		if wrote, err := st.Repair(ctx, conn, CheckOptions{}, f, now); err != nil || !wrote {
			t.Fatalf("repair %v: %v %v", f, wrote, err)
		}
	}
	checkClean(t, st, conn, "after repair")
	if kp, ids, _, err := st.PopKey(ctx, conn, "q", w1, 1, now+1); err != nil || kp != "q#k" || len(ids) != 1 {
		t.Fatalf("pop after repair: %s %v %v", kp, ids, err)
	}
}

// A limit that cannot be read is not no limit: a limits hash of the
// wrong type fails the read of the limits and the claim, and the task
// stays in the in-flight list, for its return.
func TestUnreadableLimits(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := enqueued("a")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SET", s.Keys.Limit("q"), "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.QueueLimits(ctx, c, []string{"q"}); err == nil || !IsWrongType(err) {
		t.Fatalf("QueueLimits of a wrong-typed hash: %v, want a wrong-type error", err)
	}
	if _, err := s.Pop(ctx, c, "q", w1); err != nil {
		t.Fatal(err)
	}
	cs := &ClaimState{Limits: Limits{MaxRunning: 1, Rate: Rate{N: 1, Per: time.Second}}}
	if _, _, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, cs); err == nil {
		t.Fatal("a claim read limits of the wrong type as none")
	}
	if ids, _ := redis.Strings(c.Do("LRANGE", s.Keys.Inflight(w1), 0, -1)); !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("in-flight list %v, want [a]", ids)
	}
}

// A key's rate: its N-th start in a window is the last, the next waits
// out of turn until the window opens, and another key starts meanwhile;
// the key's log expires a period after its last start.
func TestKeyRate(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	lim := Limits{KeyRate: Rate{N: 1, Per: 2 * time.Second}}
	if err := s.SetQueueLimits(ctx, c, "q", lim); err != nil {
		t.Fatal(err)
	}
	if err := s.Enqueue(ctx, c, t0, keyedRecs([]string{"a", "b", "x"}, []string{"k", "k", "other"})); err != nil {
		t.Fatal(err)
	}
	claim := func(kp, id string, now int64) (ClaimResult, int64) {
		t.Helper()
		if _, err := c.Do("RPOPLPUSH", s.Keys.Ready(kp), s.Keys.Inflight(w1)); err != nil {
			t.Fatal(err)
		}
		cs := &ClaimState{Limits: lim}
		_, res, err := s.Claim(ctx, c, w1, kp, id, now, lease, false, cs)
		if err != nil {
			t.Fatal(err)
		}
		return res, cs.Until
	}
	if res, _ := claim("q#k", "a", t0+10); res != Claimed {
		t.Fatalf("first of key k: %v", res)
	}
	if ttl, _ := redis.Int(c.Do("TTL", s.Keys.RateLog("q#k"))); ttl < 1 || ttl > 3 {
		t.Fatalf("the key's log has TTL %d, want its period and a second", ttl)
	}
	if res, until := claim("q#k", "b", t0+20); res != KeyThrottled || until != t0+10+2000 {
		t.Fatalf("second of key k: %v until %d, want KeyThrottled until %d", res, until, t0+2010)
	}
	if sc, _ := redis.Int64(c.Do("ZSCORE", s.Keys.Rotation("q"), "k")); sc != t0+2010 {
		t.Fatalf("key k in turn at %d, want %d (its window's opening)", sc, t0+2010)
	}
	if res, _ := claim("q#other", "x", t0+30); res != Claimed {
		t.Fatalf("key other: %v, want Claimed", res)
	}
	if res, _ := claim("q#k", "b", t0+2010); res != Claimed {
		t.Fatalf("key k when its window opens: %v", res)
	}
}
