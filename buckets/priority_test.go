package buckets

import (
	"reflect"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// priorityStores runs f on a store of its own namespace against Redis 7
// restricted to the 2.4 table, and against a real Redis 2.4 when
// REDIS24_SERVER names one.
func priorityStores(t *testing.T, f func(t *testing.T, s *Store, c redis.Conn)) {
	for name, start := range map[string]func(testing.TB, ...redistest.Option) *redistest.Server{
		"redis7": redistest.Start, "redis24": redistest.Start24,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, c := storeOn(t, start(t))
			f(t, s, c)
		})
	}
}

// levelRec is newRec at level lvl.
func levelRec(id string, due int64, lvl int) *Record {
	r := newRec(id, due)
	r.Priority = lvl
	return r
}

func listOf(t *testing.T, c redis.Conn, key string) []string {
	t.Helper()
	ids, err := redis.Strings(c.Do("LRANGE", key, 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A task of a level above 1 waits in its level's lists (ready list,
// bucket, index member) wherever it is placed: at enqueue, by a move, by
// a retry, by a requeue after its worker died and by the in-flight
// recovery; its level is named in the levels set; its queue's counters
// and figures count it; and the checker finds nothing out of place.
func TestPriorityPlaces(t *testing.T) {
	t.Parallel()
	priorityStores(t, func(t *testing.T, s *Store, c redis.Conn) {
		ctx := testCtx(t)
		k := s.Keys
		recs := []*Record{levelRec("a1", t0, 0), levelRec("a3", t0, 3), levelRec("b3", t0, 3), levelRec("d2", t0+5000, 2), levelRec("d1", t0+5000, 1)}
		if err := s.Enqueue(ctx, c, t0, recs); err != nil {
			t.Fatal(err)
		}
		if got := listOf(t, c, k.Ready("q")); !reflect.DeepEqual(got, []string{"a1"}) {
			t.Errorf("level 1 ready list %v, want [a1]", got)
		}
		if got := listOf(t, c, k.Ready(Place("q", 3))); !reflect.DeepEqual(got, []string{"b3", "a3"}) {
			t.Errorf("level 3 ready list %v, want [b3 a3]", got)
		}
		levels, err := s.Levels(ctx, c)
		if err != nil || !reflect.DeepEqual(levels, map[string][]string{"q": {Place("q", 2), Place("q", 3)}}) {
			t.Errorf("Levels = %v, %v; want levels 2 (scheduled) and 3 (ready) named", levels, err)
		}
		st, err := s.Stats(ctx, c, 100)
		if err != nil || len(st) != 1 || st[0].Ready != 3 || st[0].Scheduled != 2 || st[0].Oldest == nil {
			t.Fatalf("Stats = %+v, %v; want 3 ready (of two levels), 2 scheduled", st, err)
		}
		snap, err := s.Snapshot(ctx, c, []string{"q"})
		if err != nil || snap[0].Ready != 3 || len(snap[0].OldestReady) != 2 {
			t.Fatalf("Snapshot = %+v, %v; want 3 ready, the pop ends of two levels", snap, err)
		}

		// The move takes each level's bucket to its level's list.
		if _, err := s.MoveDue(ctx, []redis.Conn{c}, MoveOpts{Now: t0 + 5000, Chunk: 16, MaxTasks: 100, Lookahead: 128}); err != nil {
			t.Fatal(err)
		}
		if got := listOf(t, c, k.Ready(Place("q", 2))); !reflect.DeepEqual(got, []string{"d2"}) {
			t.Errorf("level 2 ready list after the move %v, want [d2]", got)
		}
		if got := listOf(t, c, k.Ready("q")); !reflect.DeepEqual(got, []string{"d1", "a1"}) {
			t.Errorf("level 1 ready list after the move %v, want [d1 a1]", got)
		}
		if ok, _ := redis.Bool(c.Do("SISMEMBER", k.Levels(), Place("q", 2))); !ok {
			t.Errorf("the move did not name level 2 in the levels set")
		}

		// Pop and claim a level 3 task, then let its worker die: the
		// requeue returns it to the front of its level's list.
		id, err := s.Pop(ctx, c, Place("q", 3), w1)
		if err != nil || id != "a3" {
			t.Fatalf("Pop of level 3 = %q, %v", id, err)
		}
		r, res, err := s.Claim(ctx, c, w1, Place("q", 3), id, t0+10, lease, false, nil)
		if err != nil || res != Claimed || r.Priority != 3 {
			t.Fatalf("Claim = %+v, %v, %v", r, res, err)
		}
		if _, err := s.Requeue(ctx, c, w1, []string{"a3"}, t0+20, WorkerDied, 3); err != nil {
			t.Fatal(err)
		}
		if got := listOf(t, c, k.Ready(Place("q", 3))); !reflect.DeepEqual(got, []string{"b3", "a3"}) {
			t.Errorf("level 3 list after the requeue %v, want [b3 a3] (a3 at the front)", got)
		}

		// Popped, not claimed, and recovered from the in-flight list.
		if id, err := s.Pop(ctx, c, Place("q", 3), w1); err != nil || id != "a3" {
			t.Fatalf("Pop = %q, %v", id, err)
		}
		if _, err := s.RecoverAllInflight(ctx, c, w1, t0+30, true); err != nil {
			t.Fatal(err)
		}
		if got := listOf(t, c, k.Ready(Place("q", 3))); !reflect.DeepEqual(got, []string{"b3", "a3"}) {
			t.Errorf("level 3 list after the in-flight recovery %v, want [b3 a3]", got)
		}

		// A failure retried later waits in its level's bucket.
		if id, err := s.Pop(ctx, c, Place("q", 3), w1); err != nil || id != "a3" {
			t.Fatalf("Pop = %q, %v", id, err)
		}
		r, _, err = s.Claim(ctx, c, w1, Place("q", 3), "a3", t0+40, lease, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Finish(ctx, c, w1, "a3", r.Runs, t0+50, 60, func(r *Record) Outcome {
			r.State, r.Attempts, r.Due, r.LastError = StateRetry, r.Attempts+1, t0+9000, "boom"
			return Again
		}); err != nil {
			t.Fatal(err)
		}
		ts := BucketTime(t0+9000, s.Resolution)
		if got := listOf(t, c, k.Bucket(Place("q", 3), ts)); !reflect.DeepEqual(got, []string{"a3"}) {
			t.Errorf("level 3 bucket after the retry %v, want [a3]", got)
		}
		if got, where, err := s.Lookup(ctx, c, "a3"); err != nil || where != InBucket || got.Priority != 3 || got.State != StateRetry {
			t.Errorf("Lookup = %+v, %v, %v; want retrying in its bucket, level 3", got, where, err)
		}
		rep, err := s.CheckNamespace(ctx, c, CheckOptions{ListKeys: true})
		if err != nil || len(rep.Findings) != 0 || len(rep.Unconfirmed) != 0 {
			t.Fatalf("check: %+v, %v; want nothing out of place", rep, err)
		}
		// Cancel finds it in its level's bucket.
		if err := s.Cancel(ctx, c, "a3", t0+60, 60); err != nil {
			t.Fatal(err)
		}
		if n, _ := redis.Int(c.Do("EXISTS", k.Bucket(Place("q", 3), ts))); n != 0 {
			t.Errorf("the cancelled retry is still in its bucket")
		}
		rep, err = s.CheckNamespace(ctx, c, CheckOptions{ListKeys: true})
		if err != nil || len(rep.Findings) != 0 {
			t.Fatalf("check after the cancel: %+v, %v", rep, err)
		}
	})
}

// A task of level 3 left in no list (its push lost) is found homeless by
// the checker and placed back in its level's list by the repair.
func TestPriorityRepairHomeless(t *testing.T) {
	t.Parallel()
	priorityStores(t, func(t *testing.T, s *Store, c redis.Conn) {
		ctx := testCtx(t)
		if err := s.Enqueue(ctx, c, t0, []*Record{levelRec("h", t0, 3)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do("DEL", s.Keys.Ready(Place("q", 3))); err != nil {
			t.Fatal(err)
		}
		rep, err := s.CheckNamespace(ctx, c, CheckOptions{ListKeys: true}) // the listing finds a record in no list
		if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != FindHomeless {
			t.Fatalf("check: %+v, %v; want the task homeless", rep, err)
		}
		if wrote, err := s.Repair(ctx, c, CheckOptions{}, rep.Findings[0], t0+10); err != nil || !wrote {
			t.Fatalf("Repair = %v, %v", wrote, err)
		}
		if got := listOf(t, c, s.Keys.Ready(Place("q", 3))); !reflect.DeepEqual(got, []string{"h"}) {
			t.Errorf("level 3 list after the repair %v, want [h]", got)
		}
	})
}

// A level's ready list holding tasks while the levels set does not name
// it (the set deleted by hand, say) is reported, since no worker would pop
// it, and the repair names it again.
func TestPriorityUnlistedLevel(t *testing.T) {
	t.Parallel()
	priorityStores(t, func(t *testing.T, s *Store, c redis.Conn) {
		ctx := testCtx(t)
		if err := s.Enqueue(ctx, c, t0, []*Record{levelRec("u", t0, 4)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do("DEL", s.Keys.Levels()); err != nil {
			t.Fatal(err)
		}
		rep, err := s.CheckNamespace(ctx, c, CheckOptions{})
		if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != FindUnlistedLevel || rep.Findings[0].Member != Place("q", 4) {
			t.Fatalf("check: %+v, %v; want level 4 unlisted", rep, err)
		}
		if wrote, err := s.Repair(ctx, c, CheckOptions{}, rep.Findings[0], t0+10); err != nil || !wrote {
			t.Fatalf("Repair = %v, %v", wrote, err)
		}
		if levels, err := s.Levels(ctx, c); err != nil || !reflect.DeepEqual(levels["q"], []string{Place("q", 4)}) {
			t.Fatalf("Levels after the repair = %v, %v", levels, err)
		}
		if rep, err := s.CheckNamespace(ctx, c, CheckOptions{}); err != nil || len(rep.Findings) != 0 {
			t.Fatalf("check after the repair: %+v, %v", rep, err)
		}
	})
}
