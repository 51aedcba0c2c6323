package buckets

import (
	"errors"
	"slices"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// A batch claim of a limited queue claims as many as there are free
// slots, taking one each, and gives the rest back in order; the results
// give the slots back with a wake-up token each, and the flag goes with
// them.
func TestClaimBatchLimited(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := s.SetQueueLimits(ctx, c, "q", Limits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	if err := enqueued("a", "b", "c", "d")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 4)
	cs := make([]ClaimState, len(ids))
	for i := range cs {
		cs[i].Limits = Limits{MaxRunning: 2}
	}
	recs, res, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, cs, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res, []ClaimResult{Claimed, Claimed, Full, Full}) || !recs[0].HoldsSlot || !recs[1].HoldsSlot {
		t.Fatalf("results %v, records %v %v; want 2 claimed holding slots, 2 full", res, recs[0], recs[1])
	}
	if n, _ := redis.Int(c.Do("GET", s.Keys.Slots("q"))); n != 2 {
		t.Fatalf("sl:q = %d, want 2", n)
	}
	if ids := popAll(t, s, c, 4); !slices.Equal(ids, []string{"c", "d"}) {
		t.Fatalf("given back %v, want [c d] in order", ids)
	}
	items := []FinishItem{{ID: "a", Run: 1, Now: t0 + 20, Decide: func(*Record) Outcome { return Done }},
		{ID: "b", Run: 1, Now: t0 + 20, Decide: func(*Record) Outcome { return Done }}}
	fr, err := s.FinishGroup(ctx, c, w1, items, 60)
	if err != nil || fr[0].Err != nil || fr[1].Err != nil {
		t.Fatalf("finish: %+v, %v", fr, err)
	}
	if n, _ := redis.Int(c.Do("GET", s.Keys.Slots("q"))); n != 0 {
		t.Fatalf("sl:q = %d after the results, want 0", n)
	}
	if n, _ := redis.Int(c.Do("LLEN", s.Keys.SlotWake("q"))); n != 2 {
		t.Fatalf("%d wake-up tokens, want 2", n)
	}
	raw, _ := redis.Bytes(c.Do("GET", s.Keys.Task("a")))
	if r, err := DecodeRecord("a", raw); err != nil || r.HoldsSlot {
		t.Fatalf("done record %+v, %v: the flag must go with the slot", r, err)
	}
	// A limit of 0 claims without a slot; a negative one is refused.
	if err := s.SetQueueLimits(ctx, c, "q", Limits{MaxRunning: 0}); err != nil {
		t.Fatal(err)
	}
	cs = []ClaimState{{Limits: Limits{MaxRunning: 2}}}
	recs, res, err = s.ClaimBatch(ctx, c, w1, "q", []string{"c"}, t0+30, lease, cs, false)
	if err != nil || res[0] != Claimed || recs[0].HoldsSlot {
		t.Fatalf("claim without a limit: %v %v %v", recs, res, err)
	}
	if err := s.SetQueueLimits(ctx, c, "q", Limits{MaxRunning: -1}); !errors.Is(err, ErrInvalidLimit) {
		t.Fatalf("a negative limit: %v", err)
	}
}
