package compat_test

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/clocktest"
)

// scenarioPeriodic: a periodic entry redefined by a later scheduler
// (stale firings cancelled), listed, then run by a server whose firings
// overlap a long run and are skipped.
func scenarioPeriodic(e *env) {
	t, ctx := e.t, e.ctx
	sched := func(offset time.Duration, p engine.Periodic) *engine.Scheduler {
		cfg := e.cfg
		cfg.Advanced.Clock = clocktest.Offset(offset)
		s, err := engine.NewScheduler(e.pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.Horizon = 8 * time.Second
		if err := s.Add(p); err != nil {
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
	ls, err := c.Periodics(ctx)
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
	srv, err := engine.NewServer(e.pool, cfg, mux, engine.AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddPeriodic(engine.Periodic{Name: "slow", Every: time.Second, Type: "slow", SkipIfRunning: true}); err != nil {
		t.Fatal(err)
	}
	srv.Scheduler.Horizon = 8 * time.Second
	stop := e.run("server", srv.Run)
	waitFor(t, outcomeWait, "a skipped firing", func() bool {
		ls, err := c.Periodics(ctx)
		if err != nil {
			return false
		}
		for _, l := range ls {
			if l.Name == "slow" && l.LastState == engine.StateCancelled {
				info, err := c.Lookup(ctx, l.LastID)
				return err == nil && strings.HasPrefix(info.LastError, "skipped: previous run")
			}
		}
		return false
	})
	close(release)
	stop()
}
