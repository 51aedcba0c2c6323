package compat_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/schedule"
	"github.com/bucketq/bucketq/internal/testwait"
)

// scenarioPeriodic: a periodic entry redefined by a later scheduler
// (stale firings cancelled), listed, then run by a server whose firings
// overlap a long run and are skipped.
func scenarioPeriodic(e *env) {
	t, ctx := e.t, e.ctx
	// Each scheduler's clock stands still at base plus its offset: the
	// firings the redefinition cancels are the old ones after the newer
	// scheduler's now, so on clocks that moved a slow pass could find
	// none left to cancel.
	base := time.Now()
	sched := func(offset time.Duration, p engine.Periodic) enginehook.Scheduler {
		cfg := e.cfg
		cfg.Advanced.Clock = clocktest.NewSettable(base.Add(offset))
		s, err := enginehook.NewScheduler(e.pool, cfg, 8*time.Second, p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := sched(0, engine.Periodic{Name: "redef", Every: 2 * time.Second, Type: "tick"})
	if err := old.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	newer := sched(time.Second, engine.Periodic{Name: "redef", Every: 3 * time.Second, Type: "tick"})
	if err := newer.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	// A later pass of the same definition moves the watermark.
	if err := sched(5*time.Second, engine.Periodic{Name: "redef", Every: 3 * time.Second, Type: "tick"}).RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	c := e.client()
	in := e.inspector()
	ls, err := in.Periodics(ctx)
	if err != nil || len(ls) != 1 || ls[0].Every != "3s" || ls[0].Declarers != 3 {
		t.Fatalf("periodic list: %+v, %v", ls, err)
	}

	var running, runs atomic.Int32
	release := make(chan struct{})
	mux := engine.NewMux()
	mux.HandleFunc("tick", func(context.Context, *engine.Task) error { return nil })
	mux.HandleFunc("slow", func(ctx context.Context, task *engine.Task) error {
		running.Add(1)
		defer running.Add(-1)
		if runs.Add(1) == 1 {
			<-release
		}
		return nil
	})
	cfg := e.cfg
	cfg.Concurrency = 4
	srv, err := engine.NewServer(cfg, mux, engine.AllRoles, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddPeriodic(engine.Periodic{Name: "slow", Every: time.Second, Type: "slow", SkipIfRunning: true}); err != nil {
		t.Fatal(err)
	}
	stop := e.run("server", srv.Run)
	// The release also lets the server stop when the wait fails.
	free := sync.OnceFunc(func() { close(release) })
	defer free()
	// Any of the recent firings, not only the latest: on a busy machine
	// the latest may not be claimed yet each time it is looked at.
	testwait.Until(t, outcomeWait, "a skipped firing", func() bool {
		ls, err := in.Periodics(ctx)
		if err != nil {
			return false
		}
		for _, l := range ls {
			if l.Name != "slow" || l.Last.IsZero() {
				continue
			}
			for k := range 10 {
				info, err := c.Lookup(ctx, schedule.FiringID("slow", l.Last.Add(-time.Duration(k)*time.Second)))
				if err == nil && info.State == engine.StateCancelled && strings.HasPrefix(info.LastError, "skipped: previous run") {
					return true
				}
			}
		}
		return false
	})
	free()
	stop()
}
