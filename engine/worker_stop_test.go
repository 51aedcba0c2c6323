package engine

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Shutdown lets handlers finish until its deadline, then returns the
// unfinished tasks to their queues at once, and leaves no goroutine.
func TestShutdownReturnsUnfinished(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	eachServer(t, func(t *testing.T, e *env) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
			goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
			goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
		ctx := context.Background()
		c := e.client(t)
		started := make(chan string, 4)
		var quick atomic.Int32
		var stopReq <-chan struct{} // closed when Shutdown begins
		mux := NewMux()
		mux.HandleFunc("hang", func(ctx context.Context, t *Task) error {
			started <- t.ID
			<-ctx.Done()
			return ctx.Err()
		})
		mux.HandleFunc("quick", func(ctx context.Context, t *Task) error {
			started <- t.ID
			<-stopReq // still running when Shutdown begins
			quick.Add(1)
			return nil
		})
		srv, _ := newLaneServer(e.pool, e.cfg, mux, AllRoles)
		stopReq = srv.Worker.stopReq
		done := make(chan struct{})
		go func() { _ = srv.Run(ctx); close(done) }()
		hang, _ := idOf(c.Enqueue(ctx, "hang", nil))
		q, _ := idOf(c.Enqueue(ctx, "quick", nil))
		<-started
		<-started
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		// The hanging handler outlives the deadline: Shutdown says so.
		if err := srv.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
		}
		<-done
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("shutdown took %v", d)
		}
		if quick.Load() != 1 || e.state(t, q) != StateDone {
			t.Fatal("the quick task was not allowed to finish")
		}
		info, _ := c.Lookup(ctx, hang)
		if info.State != StateReady || info.Attempts != 0 || info.Recoveries != 0 {
			t.Fatalf("unfinished task: %s attempts %d recoveries %d; want ready, 0, 0", info.State, info.Attempts, info.Recoveries)
		}
		if ids := e.readyIDs(t, "default"); len(ids) != 1 || ids[0] != hang {
			t.Fatalf("ready list %v", ids)
		}
		if ks := e.keys(t); containsPrefix(ks, e.key("hb:")) || containsPrefix(ks, e.key("p:")) || containsPrefix(ks, e.key("f:")) {
			t.Fatalf("worker left keys behind: %v", ks)
		}
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if err := srv.Run(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Run after Shutdown: %v", err)
		}
	})
}

func containsPrefix(ss []string, p string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// A second Shutdown with an earlier deadline cuts the first one's grace
// short; Shutdown before Run closes the server.
func TestSecondShutdownAborts(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := realEnv(t)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	mux := NewMux()
	mux.HandleFunc("hang", func(ctx context.Context, t *Task) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	srv, _ := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	go srv.Run(ctx)
	id, _ := idOf(e.client(t).Enqueue(ctx, "hang", nil))
	<-started
	first := make(chan struct{})
	go func() { _ = srv.Shutdown(context.Background()); close(first) }() // no deadline
	// The first Shutdown has begun.
	<-srv.Worker.stopReq
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	t0 := time.Now()
	if err := srv.Shutdown(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v, want Canceled", err)
	}
	<-first
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("second shutdown took %v", d)
	}
	if s := e.state(t, id); s != StateReady {
		t.Fatalf("task %s after abort, want ready", s)
	}

	srv2, _ := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	if err := srv2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv2.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Shutdown: %v, want ErrClosed", err)
	}
}

// Blocking waits do not depend on the pool's read timeout: with a read
// timeout shorter than IdleWait, idle workers still wake for new tasks and
// log no failed waits.
func TestBlockingWaitOutlivesReadTimeout(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	e := privateEnv(t)
	var blpops atomic.Int32
	e.pool = &redisPool{MaxIdle: 8, Dial: func() (redisConn, error) {
		c, err := redisDial("tcp", e.srv.Addr, redisDialReadTimeout(500*time.Millisecond))
		if err != nil {
			return nil, err
		}
		return &blpopCounter{Conn: c, n: &blpops}, nil
	}}
	var warned atomic.Int32
	e.cfg.Logger = slogCounting(&warned)
	e.cfg.Advanced.IdleWait = 2 * time.Second
	ran := make(chan struct{}, 1)
	mux := NewMux()
	mux.HandleFunc("t", func(ctx context.Context, t *Task) error { ran <- struct{}{}; return nil })
	srv, _ := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	runBackground(t, srv.Run)
	// Two idle timeouts each of the worker's waiter and the dispatcher's
	// waker: their third BLPOPs are sent.
	waitFor(t, outcomeWait, "two idle timeouts", func() bool { return blpops.Load() >= 6 })
	if _, err := e.client(t).Enqueue(context.Background(), "t", nil, In(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(3 * time.Second):
		t.Fatal("task did not run")
	}
	if n := warned.Load(); n != 0 {
		t.Fatalf("%d warnings while idle", n)
	}
}

// popReplyLoser is a connection that, once armed, lets the first
// RPOPLPUSH that moves a task reach the server and then loses its reply,
// as a dropped connection would.
type popReplyLoser struct {
	redisConn
	armed *atomic.Bool
	dead  bool
}

func (c *popReplyLoser) Do(cmd string, args ...interface{}) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	rep, err := c.redisConn.Do(cmd, args...)
	if lost := c.lose(cmd, rep); lost {
		return nil, errInjected
	}
	return rep, err
}

func (c *popReplyLoser) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	rep, err := redisDoContext(c.redisConn, ctx, cmd, args...)
	if lost := c.lose(cmd, rep); lost {
		return nil, errInjected
	}
	return rep, err
}

func (c *popReplyLoser) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redisReceiveContext(c.redisConn, ctx)
}

func (c *popReplyLoser) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	rep, err := redisDoWithTimeout(c.redisConn, d, cmd, args...)
	if lost := c.lose(cmd, rep); lost {
		return nil, errInjected
	}
	return rep, err
}

func (c *popReplyLoser) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redisReceiveWithTimeout(c.redisConn, d)
}

func (c *popReplyLoser) lose(cmd string, rep interface{}) bool {
	if cmd == "RPOPLPUSH" && rep != nil && c.armed.CompareAndSwap(true, false) {
		c.dead = true
		c.redisConn.Close()
		return true
	}
	return false
}

func (c *popReplyLoser) Err() error {
	if c.dead {
		return errInjected
	}
	return c.redisConn.Err()
}

// A pop whose reply is lost leaves the task in the live worker's
// in-flight list; the worker gives it back by itself, without waiting for
// shutdown or a reaper, and it runs once.
func TestLostPopReplyRecovered(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	var armed atomic.Bool
	base := e.pool
	e.pool = &redisPool{MaxIdle: 16, Dial: func() (redisConn, error) {
		c, err := base.Dial()
		if err != nil {
			return nil, err
		}
		return &popReplyLoser{redisConn: c, armed: &armed}, nil
	}}
	rec := newRecorder(nil)
	e.cfg.Concurrency = 1
	w, _ := newWorker(e.pool, e.cfg, rec)
	blpops := e.srv.Census.Count("BLPOP")
	runBackground(t, w.Run)
	// Armed once the worker is idle: its waiter blocks.
	waitFor(t, outcomeWait, "the idle worker's BLPOP", func() bool { return e.srv.Census.Count("BLPOP") > blpops })
	armed.Store(true)
	id, err := idOf(e.client(t).Enqueue(context.Background(), "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "the task to run", func() bool { return rec.count(id) == 1 })
	if armed.Load() {
		t.Fatal("the fault never fired")
	}
	waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })
	if n := rec.count(id); n != 1 {
		t.Fatalf("ran %d times", n)
	}
}

// ShutdownTimeout bounds Shutdown too: with a context that never ends (as
// in `defer srv.Shutdown(context.Background())`), a handler that outlives
// ShutdownTimeout has its context cancelled and its task given back, and
// Shutdown returns with an error matching context.DeadlineExceeded.
func TestShutdownBoundedByShutdownTimeout(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"worker", "server"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			e := realEnv(t)
			ctx := context.Background()
			started := make(chan struct{}, 1)
			cancelled := make(chan struct{})
			release := make(chan struct{})
			defer close(release)
			mux := NewMux()
			mux.HandleFunc("slow", func(ctx context.Context, t *Task) error {
				started <- struct{}{}
				select {
				case <-ctx.Done():
					close(cancelled)
					return ctx.Err()
				case <-release: // the test ended: the bound did not hold
					return nil
				}
			})
			cfg := e.cfg
			cfg.ShutdownTimeout = 200 * time.Millisecond
			var run, shutdown func(context.Context) error
			if which == "worker" {
				w, err := newWorker(e.pool, cfg, mux)
				if err != nil {
					t.Fatal(err)
				}
				run, shutdown = w.Run, w.Shutdown
			} else {
				srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
				if err != nil {
					t.Fatal(err)
				}
				run, shutdown = srv.Run, srv.Shutdown
			}
			ran := make(chan error, 1)
			go func() { ran <- run(ctx) }()
			id, _ := idOf(e.client(t).Enqueue(ctx, "slow", nil))
			<-started
			returned := make(chan error, 1)
			go func() { returned <- shutdown(context.Background()) }()
			// Real time is what is tested: Shutdown must return soon after
			// ShutdownTimeout (200 ms), however long the handler would run.
			select {
			case err := <-returned:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Shutdown(context.Background()) waited past ShutdownTimeout for a running handler")
			}
			select {
			case <-cancelled:
			default:
				t.Fatal("the handler's context was not cancelled")
			}
			<-ran
			if s := e.state(t, id); s != StateReady {
				t.Fatalf("task %s after the bound, want ready (given back)", s)
			}
		})
	}
}
