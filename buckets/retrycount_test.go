package buckets

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

// The state gauges are disjoint: a retry waiting in its bucket is counted
// as retrying and not as scheduled, and a move that takes it, whole or in
// part, moves it out of the retrying gauge (the bucket's retry count says
// how many of its first entries are retries). Cancel keeps them exact too.
func TestRetryGaugesDisjoint(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	due := t0 + 5000
	if err := claimed("r1", "r2", "r3")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, out, err := s.Finish(ctx, c, w1, id, 1, t0+20, 60, func(r *Record) Outcome {
			r.State, r.Due, r.LastError = StateRetry, due, "boom"
			return Again
		}); err != nil || out != Again {
			t.Fatalf("finish %s: %v, %v", id, out, err)
		}
	}
	var recs []*Record
	for _, id := range []string{"s1", "s2", "s3"} {
		recs = append(recs, newRec(id, due))
	}
	if err := s.Enqueue(ctx, c, t0+20, recs); err != nil {
		t.Fatal(err)
	}
	member := Member("q", BucketTime(due, 1000))
	gauges := func(step string, scheduled, retrying, ready int64) {
		t.Helper()
		snap, err := s.Snapshot(ctx, c, []string{"q"})
		if err != nil {
			t.Fatal(err)
		}
		if g := snap[0]; g.Scheduled != scheduled || g.Retrying != retrying || g.Ready != ready {
			t.Fatalf("%s: scheduled %d retrying %d ready %d; want %d %d %d", step, g.Scheduled, g.Retrying, g.Ready, scheduled, retrying, ready)
		}
		rep, err := s.CheckNamespace(ctx, c, CheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Findings)+len(rep.Unconfirmed) > 0 {
			t.Fatalf("%s: check finds %v %v", step, rep.Findings, rep.Unconfirmed)
		}
	}
	gauges("three retries and three first attempts in one bucket", 3, 3, 0)

	// Cancelling a retry in its bucket leaves the retrying gauge.
	if err := s.Cancel(ctx, c, "r2", t0+30, 60); err != nil {
		t.Fatal(err)
	}
	gauges("a retry cancelled", 3, 2, 0)

	// Moves in part: the retries are the bucket's first entries.
	for _, step := range []struct {
		max                        int
		scheduled, retrying, ready int64
	}{{1, 3, 1, 1}, {2, 2, 0, 3}, {10, 0, 0, 5}} {
		res, err := s.Move(ctx, c, []string{member}, step.max)
		if err != nil {
			t.Fatal(err)
		}
		if res.Tasks == 0 {
			t.Fatalf("move of %d: %+v", step.max, res)
		}
		gauges("after a move", step.scheduled, step.retrying, step.ready)
	}
	if n, err := redis.Int(c.Do("HLEN", s.Keys.RetryCounts())); err != nil || n != 0 {
		t.Fatalf("retry counts left: %d, %v; want none once the bucket is gone", n, err)
	}
}

// A claim that gives a task back (its queue is paused) to a ready list
// that another writer made a string meanwhile loses nothing: 2.4 runs
// the claim's LREM from the in-flight list all the same, so the list is
// set aside and the id pushed again.
func TestClaimGiveBackToWrongTypedReadyList(t *testing.T) {
	t.Parallel()
	s, pool, _ := realStore(t)
	ctx := testCtx(t)
	c := pool.Get()
	defer c.Close()
	if err := popped("a")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SADD", s.Keys.Paused(), "q"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SET", s.Keys.Ready("q"), "not a list"); err != nil {
		t.Fatal(err)
	}
	_, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil)
	if err != nil || res != Paused {
		t.Fatalf("claim = %v, %v; want Paused", res, err)
	}
	ids, err := redis.Strings(c.Do("LRANGE", s.Keys.Ready("q"), 0, -1))
	if err != nil || len(ids) != 1 || ids[0] != "a" {
		t.Fatalf("ready list %v, %v; want the id given back", ids, err)
	}
	if v, _ := redis.String(c.Do("GET", s.Keys.Quarantine(s.Keys.Ready("q")))); v != "not a list" {
		t.Fatalf("quarantine %q; want the string set aside", v)
	}
}
