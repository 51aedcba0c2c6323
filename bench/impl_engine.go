package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/clocktest"
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
	keys   buckets.Keys // the namespace's key names, set by Open

	roundTrips atomic.Int64 // waits for replies on the pool's connections

	mu          sync.Mutex
	dispatchers int // started by StartDispatchers, woken by Release
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
	keys, err := buckets.NewKeys(e.ns)
	if err != nil {
		return err
	}
	e.keys = keys
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
	e.cfg = engine.Config{Namespace: e.ns, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Advanced: engine.AdvancedConfig{Resolution: e.res}}
	c, err := engine.NewClient(e.cfg, e.pool)
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
	_, err := e.client.Enqueue(ctx, "bench", encodeTask(t), engine.At(t.Due))
	return err
}

// EnqueueBatch implements Batcher.
func (e *engineImpl) EnqueueBatch(ctx context.Context, ts []Task) error {
	return e.batch(ctx, e.client, ts, false)
}

// EnqueueKeyed implements keyedEnqueuer: one EnqueueBatch call, every
// task with engine.Key(key).
func (e *engineImpl) EnqueueKeyed(ctx context.Context, ts []Task, key string) error {
	nt := make([]engine.NewTask, len(ts))
	for i, t := range ts {
		nt[i] = engine.NewTask{Type: "bench", Payload: encodeTask(t), Options: []engine.Option{engine.Key(key)}}
	}
	_, err := e.client.EnqueueBatch(ctx, nt)
	return err
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
// cc.Workers slots) plus cc.Dispatchers-1 more dispatchers; with
// cc.MaxRunning the Server's queue has that concurrency limit.
func (e *engineImpl) Consume(ctx context.Context, cc ConsumeConfig, h Handler) (func() error, error) {
	cfg := e.cfg
	cfg.Concurrency = max(cc.Workers, 1)
	if cc.MaxRunning > 0 {
		// The queue Enqueue uses; the Server writes its limit to Redis
		// when it starts.
		cfg.Queues = []engine.QueueConfig{{Name: engine.DefaultConfig().DefaultQueue, MaxRunning: cc.MaxRunning}}
	}
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
	srv, err := engine.NewServer(cfg, mux, roles, e.pool)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Run(rctx) }()
	for i := 1; i < cc.Dispatchers; i++ {
		d, err := engine.NewServer(cfg, nil, engine.RoleDispatcher, e.pool)
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
// goes straight to the ready list, and the bucket index is then renamed
// out of the dispatchers' sight (seedIndex) until Release.
func (e *engineImpl) SeedDue(ctx context.Context, ts []Task) error {
	cfg := e.cfg
	cfg.Advanced.Clock = clocktest.Offset(-2 * time.Hour)
	c, err := engine.NewClient(cfg, e.pool)
	if err != nil {
		return err
	}
	for i := 0; i < len(ts); i += 1000 {
		if err := e.batch(ctx, c, ts[i:min(i+1000, len(ts))], true); err != nil {
			return err
		}
	}
	_, err = e.do(ctx, "RENAME", e.keys.Schedule(), e.seedIndex())
	return err
}

// seedIndex is where SeedDue keeps the bucket index until Release.
func (e *engineImpl) seedIndex() string { return e.keys.Prefix() + "bench-seed" }

// do sends one command on a connection of the pool.
func (e *engineImpl) do(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.Do(cmd, args...)
}

// StartDispatchers implements Dispatcher: it starts n dispatchers and
// waits until they are idle (the index is empty, so each blocks on its wake
// list): like asynq's forwarders, they are running and connected when the
// backlog appears.
func (e *engineImpl) StartDispatchers(ctx context.Context, n int) (func() error, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	stop := func() error {
		cancel()
		wg.Wait()
		return nil
	}
	e.dispatchers = n
	for i := 0; i < n; i++ {
		d, err := engine.NewServer(e.cfg, nil, engine.RoleDispatcher, e.pool)
		if err != nil {
			_ = stop()
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(rctx) }()
	}
	if err := e.waitBlocked(ctx, n); err != nil {
		_ = stop()
		return nil, err
	}
	return stop, nil
}

// waitBlocked waits until n clients of the server are blocked in BLPOP
// (CLIENT LIST, where the server has it; otherwise a pause). On the
// harness's own server those are the dispatchers on their wake list; on a
// shared one others may count too, and the wait may end early.
func (e *engineImpl) waitBlocked(ctx context.Context, n int) error {
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		list, err := redis.String(conn.Do("CLIENT", "LIST"))
		if err != nil || !strings.Contains(list, " cmd=") {
			// No CLIENT LIST, or one that does not name commands.
			return sleepOrErr(ctx, 500*time.Millisecond)
		}
		if strings.Count(list, "cmd=blpop") >= n {
			return nil
		}
		if err := sleepOrErr(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("engine: %d dispatchers not idle after 10s", n)
}

// sleepOrErr sleeps d, or returns ctx's error.
func sleepOrErr(ctx context.Context, d time.Duration) error {
	if !sleepCtx(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// Release implements Dispatcher: the bucket index comes back under its
// name and a wake token per dispatcher is pushed, in one MULTI/EXEC, as an
// enqueue of something due wakes idle dispatchers.
func (e *engineImpl) Release(ctx context.Context) error {
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	e.mu.Lock()
	n := max(1, e.dispatchers)
	e.mu.Unlock()
	_ = conn.Send("MULTI")
	_ = conn.Send("RENAME", e.seedIndex(), e.keys.Schedule())
	for range n {
		_ = conn.Send("LPUSH", e.keys.Wake(), "1")
	}
	_, err = conn.Do("EXEC")
	return err
}

// ReadyCount implements Dispatcher: the ready list of the default queue.
func (e *engineImpl) ReadyCount(ctx context.Context) (int64, error) {
	return redis.Int64(e.do(ctx, "LLEN", e.keys.Ready("default")))
}

// IdleIntervals implements Idler: the periods of what Consume starts (a
// Server with every role), at the engine's defaults.
func (e *engineImpl) IdleIntervals() map[string]time.Duration {
	d := engine.DefaultConfig()
	return map[string]time.Duration{"idle_wait": d.Advanced.IdleWait, "heartbeat": d.Advanced.HeartbeatInterval, "reap_interval": d.Advanced.ReapInterval}
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
