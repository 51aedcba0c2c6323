package buckets

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// firingRec is the record of entry e's firing at due, as the engine
// makes it.
func firingRec(e string, due int64, skip bool) *Record {
	r := newRec(fmt.Sprintf("p:%s@%d", e, due), due)
	r.Periodic, r.SkipIfRunning = e, skip
	return r
}

// everyPlan plans firings every step ms from the watermark (or from now
// for a new entry) up to now+horizon.
func everyPlan(e string, now, step, horizon int64) func(last int64) PassPlan {
	return func(last int64) PassPlan {
		from := max(last, now)
		p := PassPlan{Last: last}
		for f := (from/step + 1) * step; f <= now+horizon; f += step {
			p.Recs = append(p.Recs, firingRec(e, f, false))
			p.Last = f
		}
		return p
	}
}

func noStale([]byte, int64) []string { return nil }

func pass(ctx context.Context, s *Store, c redis.Conn, fp string, stamp, now, step int64, stale func([]byte, int64) []string) (PassResult, error) {
	return s.SchedulePass(ctx, c, PassEntry{Name: "e", Def: []byte("def-" + fp), FP: fp, Stamp: stamp}, now, "s1", 30, 3600,
		everyPlan("e", now, step, 10_000), stale)
}

// The scheduling pass and the overlap claim join the crash-point cases
// of TestCrashPoints.
func init() {
	crashCases = append(crashCases,
		crashCase{"SchedulePass/create", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
			_, err := pass(ctx, s, c, "a", 1, t0, 2000, noStale)
			return err
		}},
		crashCase{"SchedulePass/advance", func(ctx context.Context, s *Store, c redis.Conn) error {
			_, err := pass(ctx, s, c, "a", 1, t0, 2000, noStale)
			return err
		}, func(ctx context.Context, s *Store, c redis.Conn) error {
			_, err := pass(ctx, s, c, "a", 1, t0+5000, 2000, noStale)
			return err
		}},
		crashCase{"SchedulePass/redefine", func(ctx context.Context, s *Store, c redis.Conn) error {
			_, err := pass(ctx, s, c, "a", 1, t0, 2000, noStale)
			return err
		}, func(ctx context.Context, s *Store, c redis.Conn) error {
			res, err := pass(ctx, s, c, "b", 2, t0, 3000, func(_ []byte, last int64) []string {
				var ids []string
				for f := (t0/2000 + 1) * 2000; f <= last; f += 2000 {
					if f%3000 != 0 {
						ids = append(ids, fmt.Sprintf("p:e@%d", f))
					}
				}
				return ids
			})
			if err == nil && (!res.Redefined || len(res.Cancelled) == 0) {
				err = fmt.Errorf("redefine: %+v", res)
			}
			return err
		}},
		crashCase{"Claim/skip if running", func(ctx context.Context, s *Store, c redis.Conn) error {
			a, b := firingRec("e", t0-2000, true), firingRec("e", t0-1000, true)
			if err := s.Enqueue(ctx, c, t0, []*Record{a, b}); err != nil {
				return err
			}
			for range 2 {
				if _, err := s.Pop(ctx, c, "q", w1); err != nil {
					return err
				}
			}
			_, res, err := s.Claim(ctx, c, w1, "q", a.ID, t0+10, lease, false, nil)
			if err == nil && res != Claimed {
				err = fmt.Errorf("claim: %v", res)
			}
			return err
		}, func(ctx context.Context, s *Store, c redis.Conn) error {
			_, res, err := s.Claim(ctx, c, w1, "q", fmt.Sprintf("p:e@%d", t0-1000), t0+20, lease, false, nil)
			if err == nil && res != Skipped {
				err = fmt.Errorf("claim: %v, want skipped", res)
			}
			return err
		}},
	)
}

// TestSchedulePassRace: passes of one entry by several declarers at the
// same moment write each firing once and move the watermark once.
func TestSchedulePassRace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	s, err := NewStore(ns, 1000)
	if err != nil {
		t.Fatal(err)
	}
	pool := srv.Pool(t)
	ctx := context.Background()
	errs := make(chan error, 8)
	results := make(chan PassResult, 8)
	for range 8 {
		go func() {
			c := pool.Get()
			defer c.Close()
			res, err := pass(ctx, s, c, "a", 1, t0, 1000, noStale)
			results <- res
			errs <- err
		}()
	}
	written := map[string]int{}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		for _, id := range (<-results).Enqueued {
			written[id]++
		}
	}
	if len(written) != 10 {
		t.Fatalf("%d firings written, want 10", len(written))
	}
	for id, n := range written {
		if n != 1 {
			t.Errorf("%s written %d times", id, n)
		}
	}
	c := srv.Admin(t)
	n, err := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatScheduled))
	if err != nil || n != 10 {
		t.Fatalf("scheduled gauge %d, %v", n, err)
	}
	redistest.RequireNoViolations(t, srv)
}

// TestSchedulePassSuperseded: a declarer with an older definition writes
// nothing.
func TestSchedulePassSuperseded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	s, _ := NewStore(ns, 1000)
	c := srv.Pool(t).Get()
	defer c.Close()
	ctx := context.Background()
	if _, err := pass(ctx, s, c, "b", 5, t0, 1000, noStale); err != nil {
		t.Fatal(err)
	}
	res, err := pass(ctx, s, c, "a", 4, t0+3000, 1000, func([]byte, int64) []string {
		t.Error("an older definition computed stale firings")
		return nil
	})
	if err != nil || !res.Superseded || len(res.Enqueued) != 0 {
		t.Fatalf("older definition: %+v, %v", res, err)
	}
	if fp, err := redis.String(c.Do("HGET", s.Keys.PeriodicEntry("e"), EntryFP)); err != nil || fp != "b" {
		t.Fatalf("stored fp %q, %v", fp, err)
	}
	if _, err := c.Do("DEL", s.Keys.PeriodicEntry("e")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SET", s.Keys.PeriodicEntry("e"), "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := pass(ctx, s, c, "a", 4, t0, 1000, noStale); !IsWrongType(err) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("entry of the wrong type: %v", err)
	}
}
