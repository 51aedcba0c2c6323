package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/schedule"
	"github.com/gomodule/redigo/redis"
)

// newTestScheduler returns a scheduler on e's server whose clock is off
// the real one by offset, declaring p.
func (e *env) scheduler(t *testing.T, offset time.Duration, horizon time.Duration, ps ...Periodic) *scheduler {
	t.Helper()
	cfg := e.cfg
	cfg.Advanced.Clock = clocktest.Offset(offset)
	s, err := newScheduler(e.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Horizon = horizon
	for _, p := range ps {
		if err := s.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// firingIDs lists the ids of name's firing records, and fails the test if
// any firing id sits in the buckets or ready lists more than once, or is
// placed without a record.
func (e *env) firingPlacements(t *testing.T, conn redis.Conn, name string) map[string]int {
	t.Helper()
	placed := map[string]int{}
	keys, err := redis.Strings(conn.Do("KEYS", e.key("b:*")))
	if err != nil {
		t.Fatal(err)
	}
	keys = append(keys, e.key("q:default"))
	for _, k := range keys {
		ids, err := redis.Strings(conn.Do("LRANGE", k, 0, -1))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if strings.HasPrefix(id, "p:"+name+"@") {
				placed[id]++
			}
		}
	}
	return placed
}

func (e *env) record(t *testing.T, conn redis.Conn, id string) *buckets.Record {
	t.Helper()
	raw, err := redis.Bytes(conn.Do("GET", e.key("t:"+id)))
	if errors.Is(err, redis.ErrNil) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := buckets.DecodeRecord(id, raw)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPeriodicRacingSchedulers: three schedulers with skewed clocks run
// passes of one entry at once, over and over: every firing of the window
// is enqueued, each exactly once.
func TestPeriodicRacingSchedulers(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	p := Periodic{Name: "race", Every: time.Second, Type: "tick"}
	// Each scheduler's clock, skewed, moves 100 ms after each of its
	// passes: 25 passes span 2.4 s of it. The start is half a second past
	// a whole one, so that no firing (on whole seconds) falls on an end
	// of the window.
	const passes, step = 25, 100 * time.Millisecond
	start := time.Now().Truncate(time.Second).Add(500 * time.Millisecond)
	var ss []*scheduler
	var clocks []*clocktest.Settable
	for _, off := range []time.Duration{0, 2 * time.Second, -2 * time.Second} {
		s := e.scheduler(t, off, 8*time.Second, p)
		clock := clocktest.NewSettable(start.Add(off))
		s.cfg.Advanced.Clock = clock
		ss, clocks = append(ss, s), append(clocks, clock)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Go(func() {
			for range passes {
				if err := s.RunPass(ctx); err != nil {
					t.Error(err)
					return
				}
				clocks[i].Set(clocks[i].Now().Add(step))
			}
		})
	}
	wg.Wait()
	end := start.Add((passes - 1) * step) // the last pass, unskewed
	conn := e.admin(t)
	placed := e.firingPlacements(t, conn, "race")
	for id, n := range placed {
		if n != 1 {
			t.Errorf("firing %s placed %d times", id, n)
		}
	}
	// Every firing from the first pass's horizon start to the end of the
	// window plus the horizon (of the slowest clock) has a record.
	s, _ := schedule.Parse(schedule.Spec{Every: time.Second})
	want := s.Between(start.Add(2*time.Second), end.Add(6*time.Second), 1000)
	for _, f := range want {
		id := schedule.FiringID("race", f)
		r := e.record(t, conn, id)
		if r == nil {
			t.Errorf("firing %v: no task", f)
			continue
		}
		if r.Due != f.UnixMilli() || r.Periodic != "race" {
			t.Errorf("firing %v: record due %d, entry %q", f, r.Due, r.Periodic)
		}
	}
	n, err := redis.Int(conn.Do("HGET", e.key("st:default"), "scheduled"))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, c := range placed {
		total += c
	}
	if n != total {
		t.Errorf("scheduled gauge %d, %d firings in buckets and ready lists", n, total)
	}
	if len(want) < 5 {
		t.Fatalf("only %d firings in the window", len(want))
	}
	redistest.RequireNoViolations(t, e.srv)
}

// TestPeriodicRestartContinues: a new scheduler (a restarted process)
// continues from the watermark in Redis, enqueueing nothing twice.
func TestPeriodicRestartContinues(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	p := Periodic{Name: "restart", Every: time.Second, Type: "tick"}
	ctx := context.Background()
	a := e.scheduler(t, 0, 8*time.Second, p)
	if err := a.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	conn := e.admin(t)
	last1, err := redis.Int64(conn.Do("HGET", e.key("pe:restart"), "last"))
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.firingPlacements(t, conn, "restart"))
	b := e.scheduler(t, 0, 8*time.Second, p)
	if err := b.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted scheduler continues from the watermark: it places
	// only the firings past it, none again (real time may have crossed a
	// second since the first pass, which moves the horizon by one).
	lastB, _ := redis.Int64(conn.Do("HGET", e.key("pe:restart"), "last"))
	got := len(e.firingPlacements(t, conn, "restart"))
	if got-before != int((lastB-last1)/1000) {
		t.Fatalf("a restarted scheduler enqueued %d more firings, want %d (watermark %d → %d)", got-before, (lastB-last1)/1000, last1, lastB)
	}
	before, last1 = got, lastB
	c := e.scheduler(t, 3*time.Second, 8*time.Second, p)
	if err := c.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	last2, _ := redis.Int64(conn.Do("HGET", e.key("pe:restart"), "last"))
	placed := e.firingPlacements(t, conn, "restart")
	if want := before + int((last2-last1)/1000); len(placed) != want || last2 <= last1 {
		t.Fatalf("after 3 s: %d firings placed, want %d (watermark %d → %d)", len(placed), want, last1, last2)
	}
	for id, n := range placed {
		if n != 1 {
			t.Errorf("firing %s placed %d times", id, n)
		}
	}
}

// TestPeriodicMissedPolicies: after every declarer was down for an hour,
// far longer than the horizon, the first pass applies the policy: skip
// runs none of the missed firings, once the latest, all:N the latest N.
func TestPeriodicMissedPolicies(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		missed string
		want   int
	}{{"skip", 0}, {"once", 1}, {"", 1}, {"all:3", 3}, {"all", 100}} {
		t.Run("missed="+tc.missed, func(t *testing.T) {
			name := "missed-" + strings.ReplaceAll(tc.missed, ":", "_")
			p := Periodic{Name: name, Every: 10 * time.Second, Type: "tick", Missed: tc.missed}
			a := e.scheduler(t, 0, 30*time.Second, p)
			if err := a.RunPass(ctx); err != nil {
				t.Fatal(err)
			}
			const outage = time.Hour
			b := e.scheduler(t, outage, 30*time.Second, p)
			now := time.Now().Add(outage)
			if err := b.RunPass(ctx); err != nil {
				t.Fatal(err)
			}
			conn := e.admin(t)
			var missed []int64
			for id := range e.firingPlacements(t, conn, name) {
				r := e.record(t, conn, id)
				if r.Due <= now.UnixMilli() && r.Due > now.Add(-outage+time.Minute).UnixMilli() {
					missed = append(missed, r.Due)
				}
			}
			sort.Slice(missed, func(i, j int) bool { return missed[i] < missed[j] })
			if len(missed) != tc.want {
				t.Fatalf("%d missed firings enqueued, want %d", len(missed), tc.want)
			}
			if tc.want > 0 {
				// The latest ones, ending with the latest firing before now.
				latest := now.Unix() / 10 * 10 * 1000
				for i, d := range missed {
					if want := latest - int64(len(missed)-1-i)*10000; d != want {
						t.Fatalf("missed firing %d due %d, want %d", i, d, want)
					}
				}
			}
		})
	}
}

// TestPeriodicRedefine: a newer definition of an entry cancels the
// enqueued firings its schedule does not have, keeps the common ones, and
// the process with the older definition stands down.
func TestPeriodicRedefine(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	a := e.scheduler(t, 0, 30*time.Second, Periodic{Name: "redef", Every: 2 * time.Second, Type: "tick"})
	if err := a.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	conn := e.admin(t)
	old := e.firingPlacements(t, conn, "redef")
	b := e.scheduler(t, 0, 30*time.Second, Periodic{Name: "redef", Every: 3 * time.Second, Type: "tick"})
	b.stamp = a.stamp + 1
	if err := b.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cancelled, kept := 0, 0
	for id := range old {
		r := e.record(t, conn, id)
		sec := r.Due / 1000
		switch {
		case sec%3 == 0:
			kept++
			if r.State != buckets.StateWaiting {
				t.Errorf("common firing %s: %s", id, r.State)
			}
		case r.Due > now.Add(time.Second).UnixMilli():
			cancelled++
			if r.State != buckets.StateCancelled {
				t.Errorf("stale firing %s: %s, want cancelled", id, r.State)
			}
		}
	}
	if cancelled == 0 || kept == 0 {
		t.Fatalf("cancelled %d, kept %d of %d firings", cancelled, kept, len(old))
	}
	placed := e.firingPlacements(t, conn, "redef")
	for id := range placed {
		if r := e.record(t, conn, id); r.Due/1000%3 != 0 && r.State != buckets.StateWaiting {
			t.Errorf("cancelled firing %s still placed", id)
		}
	}
	fp, _ := redis.String(conn.Do("HGET", e.key("pe:redef"), "fp"))
	if fp != b.entries[0].sched.Fingerprint() {
		t.Fatalf("stored fingerprint %s, want the new one", fp)
	}
	// The older definition's process stands down: its pass writes nothing.
	lastBefore, _ := redis.Int64(conn.Do("HGET", e.key("pe:redef"), "last"))
	if err := a.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	if fp2, _ := redis.String(conn.Do("HGET", e.key("pe:redef"), "fp")); fp2 != fp {
		t.Fatal("the older definition was written back")
	}
	if l, _ := redis.Int64(conn.Do("HGET", e.key("pe:redef"), "last")); l != lastBefore {
		t.Fatal("the superseded process moved the watermark")
	}
	n, _ := redis.Int(conn.Do("HGET", e.key("st:default"), "scheduled"))
	if n != len(e.firingPlacements(t, conn, "redef")) {
		t.Fatalf("scheduled gauge %d after cancelling", n)
	}
}

// TestPeriodicListOrphan: the listing shows schedule, watermark, next
// and last firing with its state, and an entry whose declarers are all
// gone as orphaned.
func TestPeriodicListOrphan(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	s := e.scheduler(t, 0, 8*time.Second, Periodic{Name: "listed", Every: time.Second, Type: "tick", Missed: "all:2"})
	if err := s.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	cl := e.client(t)
	ls, err := cl.Periodics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 {
		t.Fatalf("%d entries listed", len(ls))
	}
	l := ls[0]
	if l.Name != "listed" || l.Every != "1s" || l.Missed != "all:2" || l.Orphaned || l.Declarers != 1 ||
		l.Next.IsZero() || l.Scheduled.Before(l.Next) {
		t.Fatalf("listing %+v", l)
	}
	// Its declarer dies (its liveness key expires).
	conn := e.admin(t)
	if _, err := conn.Do("DEL", e.key("ps:"+s.ID())); err != nil {
		t.Fatal(err)
	}
	ls, err = cl.Periodics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ls[0].Orphaned || ls[0].Declarers != 0 {
		t.Fatalf("after its declarer died: %+v", ls[0])
	}
	n, err := e.client(t).store.PruneDeclarers(ctx, conn, "listed")
	if err != nil || n != 1 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	// The checker finds nothing wrong with firings and entries.
	rep, err := cl.Check(ctx, CheckOptions{})
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("check: %+v, %v", rep, err)
	}
}

// TestPeriodicEndToEndDST: a daily 02:30 Europe/Berlin entry on the day
// the clocks jump from 02:00 to 03:00 fires at 03:00 CEST (01:00 UTC),
// run by a whole Server on a clock set just before; the handler sees the
// firing time and the entry.
func TestPeriodicEndToEndDST(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	firing := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)
	e.cfg.Advanced.Clock = clocktest.Offset(time.Until(firing.Add(-2 * time.Second)))
	got := make(chan *Task, 1)
	h := HandlerFunc(func(ctx context.Context, task *Task) error {
		select {
		case got <- task:
		default:
		}
		return nil
	})
	srv, err := newLaneServer(e.pool, e.cfg, h, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddPeriodic(Periodic{Name: "dst", Cron: "30 2 * * *", Location: "Europe/Berlin", Type: "report"}); err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, srv.Run)
	defer stop()
	select {
	case task := <-got:
		if !task.Due.Equal(firing) || task.Periodic != "dst" || task.ID != schedule.FiringID("dst", firing) {
			t.Fatalf("task %s due %v entry %q, want firing %v", task.ID, task.Due.UTC(), task.Periodic, firing)
		}
	case <-time.After(outcomeWait):
		t.Fatal("the firing did not run")
	}
}

// TestPeriodicSkipIfRunning: while a firing's run is still running, the
// next firing is skipped, as a cancelled task that says why.
func TestPeriodicSkipIfRunning(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	release := make(chan struct{})
	var running, overlaps, runs atomic.Int32
	h := HandlerFunc(func(ctx context.Context, task *Task) error {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		if runs.Add(1) == 1 {
			<-release
		}
		return nil
	})
	e.cfg.Concurrency = 4
	srv, err := newLaneServer(e.pool, e.cfg, h, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddPeriodic(Periodic{Name: "slow", Every: time.Second, Type: "slow", SkipIfRunning: true}); err != nil {
		t.Fatal(err)
	}
	srv.Scheduler.Horizon = 8 * time.Second
	stop := runBackground(t, srv.Run)
	defer stop()
	conn := e.admin(t)
	var skipped *buckets.Record
	waitFor(t, outcomeWait, "a skipped firing", func() bool {
		for id := range e.firingPlacementsAll(t, conn, "slow") {
			if r := e.record(t, conn, id); r != nil && r.State == buckets.StateCancelled {
				skipped = r
				return true
			}
		}
		return false
	})
	close(release)
	if !strings.HasPrefix(skipped.LastError, "skipped: previous run p:slow@") {
		t.Fatalf("skipped firing's reason %q", skipped.LastError)
	}
	waitFor(t, outcomeWait, "a run after the long one", func() bool { return runs.Load() >= 3 })
	if overlaps.Load() != 0 {
		t.Fatalf("%d runs overlapped", overlaps.Load())
	}
}

// firingPlacementsAll lists name's firing ids from their records.
func (e *env) firingPlacementsAll(t *testing.T, conn redis.Conn, name string) map[string]bool {
	t.Helper()
	keys, err := redis.Strings(conn.Do("KEYS", e.key(fmt.Sprintf("t:p:%s@*", name))))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, k := range keys {
		out[strings.TrimPrefix(k, e.key("t:"))] = true
	}
	return out
}
