package engine

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// A handler's progress shows in Lookup, Inspector.Task and the running
// listing while it runs, and stays on the done task; bad reports are
// refused with clear errors, and outside a handler SetProgress says so.
func TestProgressShown(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		reported, release := make(chan struct{}), make(chan struct{})
		errs := make(chan error, 1)
		mux := NewMux()
		mux.HandleFunc("long", func(ctx context.Context, _ *Task) error {
			bad := []error{
				SetProgress(ctx, math.NaN(), ""),
				SetProgress(ctx, 1, strings.Repeat("x", 257)),
				SetProgress(ctx, 1, "\xff"),
			}
			if !errors.Is(bad[0], ErrInvalid) || !errors.Is(bad[1], ErrTooLarge) || !errors.Is(bad[2], ErrInvalid) {
				errs <- errors.Join(append([]error{errors.New("bad reports not refused as expected")}, bad...)...)
			}
			if err := SetProgress(ctx, 40, "page 4 of 10"); err != nil {
				errs <- err
			}
			close(reported)
			<-release
			return SetProgress(ctx, 100, "all pages")
		})
		srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		c := e.client(t)
		in := c.inspector()
		id, err := idOf(c.Enqueue(ctx, "long", nil))
		if err != nil {
			t.Fatal(err)
		}
		<-reported
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		// The first report is written at once, on its own connection.
		waitFor(t, outcomeWait, "the progress in Lookup", func() bool {
			info, err := c.Lookup(ctx, id)
			return err == nil && info.Progress == 40
		})
		info, _ := c.Lookup(ctx, id)
		if info.State != StateRunning || info.ProgressNote != "page 4 of 10" || info.ProgressTime.IsZero() {
			t.Fatalf("running task: state %s progress %v %q at %v", info.State, info.Progress, info.ProgressNote, info.ProgressTime)
		}
		page, err := in.ListTasks(ctx, ListOptions{Filter: Filter{State: StateRunning}, Limit: 10})
		if err != nil || len(page.Tasks) != 1 || page.Tasks[0].Progress != 40 || page.Tasks[0].ProgressNote != "page 4 of 10" {
			t.Fatalf("running listing: %+v, %v", page, err)
		}
		close(release)
		waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })
		// The last report of a run is offered when its handler returns and
		// written by the worker's progress writer, not in the result's
		// transaction: it lands on the done task within that write.
		waitFor(t, outcomeWait, "the last report on the done task", func() bool {
			v, err := in.Task(ctx, id)
			return err == nil && v.Progress == 100
		})
		v, err := in.Task(ctx, id)
		if err != nil || v.Progress != 100 || v.ProgressNote != "all pages" || v.State != StateDone {
			t.Fatalf("done task: %+v, %v", v, err)
		}
		if err := SetProgress(ctx, 1, ""); err == nil {
			t.Fatal("SetProgress outside a handler: no error")
		}
	})
}

// A handler that reports its progress many thousand times a second costs
// a few commands a second: reports replace the value in memory and one
// is written at most once a second. Real time is what is measured here
// (writes per second), so the handler runs for a real 1.5 s.
func TestProgressWritesBounded(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	calls := make(chan int, 1)
	mux := NewMux()
	mux.HandleFunc("busy", func(ctx context.Context, _ *Task) error {
		n := 0
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); n++ {
			if err := SetProgress(ctx, float64(n), "working"); err != nil {
				return err
			}
		}
		calls <- n
		return nil
	})
	srv, err := newLaneServer(e.pool, e.cfg, mux, RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	c := e.client(t)
	id, err := idOf(c.Enqueue(ctx, "busy", nil))
	if err != nil {
		t.Fatal(err)
	}
	n := <-calls
	waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })
	// The last report is offered when the handler returns and written by
	// the progress writer on its own goroutine, maybe after the result.
	var info *TaskInfo
	waitFor(t, outcomeWait, "the last report written", func() bool {
		var err error
		info, err = c.Lookup(ctx, id)
		return err == nil && info.Progress == float64(n-1)
	})
	sent := srv.Worker.progress.sent.Load()
	t.Logf("%d reports in 1.5 s, %d writes", n, sent)
	if n < 100 {
		t.Fatalf("the handler reported only %d times in 1.5 s: too few to judge the bound", n)
	}
	// The first report, one a second after it, the last one: 3 (one
	// more if the handler's last second straddles a write).
	if sent > 4 {
		t.Fatalf("%d reports sent %d writes; want at most 4", n, sent)
	}
}
