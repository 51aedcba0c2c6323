package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/gomodule/redigo/redis"
)

// engineImpl adapts this repository's engine (github.com/bucketq/bucketq,
// through the replace directive in go.mod). "engine" runs the default
// configuration; "engine-1ms" and "engine-100ms" change only the bucket
// resolution, to show what it costs and buys.
type engineImpl struct {
	name   string
	res    time.Duration
	pool   *redis.Pool
	cfg    engine.Config
	client *engine.Client
	ns     string

	roundTrips atomic.Int64 // waits for replies on the pool's connections

	mu      sync.Mutex
	pending []*engine.Dispatcher // prepared by StartDispatchers, run by Release
	runCtx  context.Context
	runWG   *sync.WaitGroup
}

func init() {
	register("engine", func() Impl { return &engineImpl{name: "engine"} })
	register("engine-1ms", func() Impl { return &engineImpl{name: "engine-1ms", res: time.Millisecond} })
	register("engine-100ms", func() Impl { return &engineImpl{name: "engine-100ms", res: 100 * time.Millisecond} })
}

// Name implements Impl.
func (e *engineImpl) Name() string { return e.name }

// Open implements Impl. The engine has no poll interval: it blocks, so
// env.Poll does not apply.
func (e *engineImpl) Open(ctx context.Context, env Env) error {
	e.ns = env.Namespace
	addr := env.Addr
	e.pool = &redis.Pool{
		Dial: func() (redis.Conn, error) {
			c, err := redis.Dial("tcp", addr, redis.DialConnectTimeout(5*time.Second))
			if err != nil {
				return nil, err
			}
			return &rtConn{Conn: c, n: &e.roundTrips}, nil
		},
		MaxIdle:     256,
		IdleTimeout: time.Minute,
	}
	e.cfg = engine.Config{Namespace: e.ns, Resolution: e.res, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := engine.NewClient(e.pool, e.cfg)
	if err != nil {
		return err
	}
	e.client = c
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Do("PING")
	return err
}

// Close implements Impl.
func (e *engineImpl) Close() error {
	if e.pool == nil {
		return nil
	}
	return e.pool.Close()
}

// KeyPatterns implements Impl: every key is under "{ns}:".
func (e *engineImpl) KeyPatterns() []string { return []string{"{" + e.ns + "}:*"} }

// Enqueue implements Impl.
func (e *engineImpl) Enqueue(ctx context.Context, t Task) error {
	_, err := e.client.Enqueue(ctx, "bench", encodeTask(t))
	return err
}

// Schedule implements Scheduler.
func (e *engineImpl) Schedule(ctx context.Context, t Task) error {
	_, err := e.client.EnqueueAt(ctx, t.Due, "bench", encodeTask(t))
	return err
}

// EnqueueBatch implements Batcher.
func (e *engineImpl) EnqueueBatch(ctx context.Context, ts []Task) error {
	return e.batch(ctx, e.client, ts, false)
}

// ScheduleBatch implements BatchScheduler.
func (e *engineImpl) ScheduleBatch(ctx context.Context, ts []Task) error {
	return e.batch(ctx, e.client, ts, true)
}

func (e *engineImpl) batch(ctx context.Context, c *engine.Client, ts []Task, at bool) error {
	nt := make([]engine.NewTask, len(ts))
	for i, t := range ts {
		nt[i] = engine.NewTask{Type: "bench", Payload: encodeTask(t)}
		if at {
			nt[i].Options = []engine.Option{engine.At(t.Due)}
		}
	}
	_, err := c.EnqueueBatch(ctx, nt)
	return err
}

// Consume implements Impl: one Server (dispatcher, reaper, worker with
// cfg.Workers slots) plus cfg.Dispatchers-1 more dispatchers.
func (e *engineImpl) Consume(ctx context.Context, cc ConsumeConfig, h Handler) (func() error, error) {
	cfg := e.cfg
	cfg.Concurrency = max(cc.Workers, 1)
	mux := engine.NewMux()
	mux.HandleFunc("bench", func(ctx context.Context, t *engine.Task) error {
		d, err := decodeTask(t.Payload)
		if err != nil {
			return engine.Permanent(err)
		}
		return h(ctx, d)
	})
	roles := engine.AllRoles
	if cc.Dispatchers < 1 {
		roles &^= engine.RoleDispatcher
	}
	srv, err := engine.NewServer(e.pool, cfg, mux, roles)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Run(rctx) }()
	for i := 1; i < cc.Dispatchers; i++ {
		d, err := engine.NewDispatcher(e.pool, cfg)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(rctx) }()
	}
	return func() error {
		err := srv.Shutdown(context.Background())
		cancel()
		wg.Wait()
		return err
	}, nil
}

// SeedDue implements Dispatcher: the tasks go into their (past) buckets as
// a producer whose clock is two hours behind would write them, so none
// goes straight to the ready list; nothing moves them until Release starts
// the dispatchers.
func (e *engineImpl) SeedDue(ctx context.Context, ts []Task) error {
	cfg := e.cfg
	cfg.Clock = offsetClock(-2 * time.Hour)
	c, err := engine.NewClient(e.pool, cfg)
	if err != nil {
		return err
	}
	for i := 0; i < len(ts); i += 1000 {
		if err := e.batch(ctx, c, ts[i:min(i+1000, len(ts))], true); err != nil {
			return err
		}
	}
	return nil
}

// StartDispatchers implements Dispatcher: it builds n dispatchers; Release
// runs them.
func (e *engineImpl) StartDispatchers(ctx context.Context, n int) (func() error, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending = nil
	for i := 0; i < n; i++ {
		d, err := engine.NewDispatcher(e.pool, e.cfg)
		if err != nil {
			return nil, err
		}
		e.pending = append(e.pending, d)
	}
	rctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	e.runCtx, e.runWG = rctx, wg
	return func() error {
		cancel()
		wg.Wait()
		return nil
	}, nil
}

// Release implements Dispatcher: the prepared dispatchers start.
func (e *engineImpl) Release(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runCtx == nil {
		return errors.New("engine: Release before StartDispatchers")
	}
	for _, d := range e.pending {
		e.runWG.Add(1)
		go func() { defer e.runWG.Done(); _ = d.Run(e.runCtx) }()
	}
	e.pending = nil
	return nil
}

// ReadyCount implements Dispatcher: the ready list of the default queue.
func (e *engineImpl) ReadyCount(ctx context.Context) (int64, error) {
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return redis.Int64(conn.Do("LLEN", "{"+e.ns+"}:q:default"))
}

// offsetClock is a clock a fixed offset away from the real one.
type offsetClock time.Duration

func (o offsetClock) Now() time.Time { return time.Now().Add(time.Duration(o)) }

// IdleIntervals implements Idler: the periods of what Consume starts (a
// Server with every role), at the engine's defaults.
func (e *engineImpl) IdleIntervals() map[string]time.Duration {
	d := engine.DefaultConfig()
	return map[string]time.Duration{"idle_wait": d.IdleWait, "heartbeat": d.HeartbeatInterval, "reap_interval": d.ReapInterval}
}

// RoundTrips implements RoundTripCounter.
func (e *engineImpl) RoundTrips() int64 { return e.roundTrips.Load() }

// rtConn counts round trips: every Do (one command, or the replies of a
// pipeline) and every Flush (a pipeline whose replies are then received).
type rtConn struct {
	redis.Conn
	n *atomic.Int64
}

func (c *rtConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	c.n.Add(1)
	return c.Conn.Do(cmd, args...)
}

func (c *rtConn) Flush() error {
	c.n.Add(1)
	return c.Conn.Flush()
}

func (c *rtConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	c.n.Add(1)
	return redis.DoWithTimeout(c.Conn, d, cmd, args...)
}

func (c *rtConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

func (c *rtConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	c.n.Add(1)
	return redis.DoContext(c.Conn, ctx, cmd, args...)
}

func (c *rtConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}
