// Package enginetest runs the engine in a unit test with no Redis of the
// test's own: [New] starts an in-process Redis (miniredis) that refuses,
// and fails the test on, any command Redis 2.4 would not accept;
// [Env.RequireEnqueued] asserts what was enqueued; [Env.Drain] runs the
// enqueued tasks' handlers on the test's goroutine until none is left,
// through the engine's own claim, result, retry, chain and group
// transactions, on a clock that jumps to the next due time instead of
// waiting for it.
//
// Only programs that import this package build miniredis in.
package enginetest

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/minihook"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
	"github.com/jonboulle/clockwork"
)

// Env is an engine on an in-process Redis, for one test.
type Env struct {
	// MaxRuns bounds the tasks one Drain takes; 0 means 10,000.
	MaxRuns int

	cfg    engine.Config
	pool   *redis.Pool
	client *engine.Client
	in     *engine.Inspector
	clock  *clockwork.FakeClock
}

// Connection timeouts of the Env's pool.
const (
	dialTimeout = 5 * time.Second
	ioTimeout   = 10 * time.Second
)

// New starts an Env for t: a miniredis behind the Redis 2.4 guard, a
// redigo pool on it and a Client, all closed by t.Cleanup. A command
// outside the 2.4 command set is refused and fails t. cfg is what the
// code under test would use; New sets its Advanced.Clock to the Env's
// clock (see Now), and a nil Logger to one that writes warnings and
// errors to t.Log.
func New(t testing.TB, cfg engine.Config) *Env {
	t.Helper()
	rep := newReporter(t)
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatalf("enginetest: start miniredis: %v", err)
	}
	t.Cleanup(m.Close)
	m.Server().SetPreHook(minihook.Hook(rep.violation))
	addr := m.Addr()
	pool := &redis.Pool{
		MaxIdle:     16,
		IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", addr, redis.DialConnectTimeout(dialTimeout),
				redis.DialReadTimeout(ioTimeout), redis.DialWriteTimeout(ioTimeout))
		},
	}
	t.Cleanup(func() { _ = pool.Close() })

	e := &Env{pool: pool, clock: clockwork.NewFakeClockAt(time.Now().Truncate(time.Millisecond))}
	cfg.Advanced.Clock = e.clock
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logWriter{rep}, &slog.HandlerOptions{Level: slog.LevelWarn,
			ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
				if len(groups) == 0 && a.Key == slog.TimeKey {
					return slog.Attr{} // real time, not the Env's clock
				}
				return a
			}}))
	}
	e.cfg = cfg
	var err error
	if e.client, err = engine.NewClient(cfg, pool); err != nil {
		t.Fatalf("enginetest: %v", err)
	}
	if e.in, err = engine.NewInspector(cfg, pool); err != nil {
		t.Fatalf("enginetest: %v", err)
	}
	return e
}

// Client returns a Client of the Env.
func (e *Env) Client() *engine.Client { return e.client }

// Pool returns the Env's pool, for code under test that builds its own
// Client, Inspector or Server (with Config).
func (e *Env) Pool() *redis.Pool { return e.pool }

// Config returns the Config the Env's parts use: New's, with its clock.
func (e *Env) Config() engine.Config { return e.cfg }

// Now is the time on the Env's clock: the time New was called, to the
// millisecond, until Drain moves it forward to a due time.
func (e *Env) Now() time.Time { return e.clock.Now() }

// reporter reports to t, but never after t has finished: the miniredis
// goroutines may outlive it.
type reporter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func newReporter(t testing.TB) *reporter {
	r := &reporter{t: t}
	// Registered first so that it runs last.
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.done = true
	})
	return r
}

func (r *reporter) violation(v *redis24.Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.t.Errorf("enginetest: command not valid for Redis 2.4: %v (command: %s %s)", v, v.Command, strings.Join(v.Args, " "))
	}
}

func (r *reporter) log(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.t.Logf("%s", s)
	}
}

// logWriter writes the engine's log lines to t.Log.
type logWriter struct{ r *reporter }

func (w logWriter) Write(p []byte) (int, error) {
	w.r.log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// describe is one line about a task, for failure messages.
func describe(ti *engine.TaskInfo) string {
	return fmt.Sprintf("%s type=%q queue=%q state=%s due=%s attempts=%d payload=%q",
		ti.ID, ti.Type, ti.Queue, ti.State, ti.Due.Format(time.RFC3339Nano), ti.Attempts, ti.Preview)
}
