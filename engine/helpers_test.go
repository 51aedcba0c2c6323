package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

// env is one test's server, pool and namespace.
type env struct {
	srv  *redistest.Server
	pool *redis.Pool
	ns   string
	cfg  Config

	tickMu   sync.Mutex
	lastTick time.Time // guarded by tickMu: the last tick's real time
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// logOnFailure points e's logger at a buffer that the test prints, with a
// dump of the namespace's keys, only if it fails: for tests that fail too
// seldom to rerun with ENGINE_TEST_LOG set. Call it before building the
// parts whose logs matter (they take e.cfg's logger). The dump is taken
// at the test's end, after the parts started later have been stopped
// (cleanups run last registered first).
func (e *env) logOnFailure(t *testing.T) {
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		return // already printed as it goes
	}
	buf := &lockedBuffer{}
	e.cfg.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("engine log:\n%s", buf.String())
		e.dump(t)
	})
}

// dump logs every key of the namespace: its type, TTL and contents.
func (e *env) dump(t testing.TB) {
	c := e.admin(t)
	keys, err := redis.Strings(c.Do("KEYS", "{"+e.ns+"}:*"))
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	sort.Strings(keys)
	for _, k := range keys {
		typ, _ := redis.String(c.Do("TYPE", k))
		ttl, _ := redis.Int64(c.Do("TTL", k))
		var v interface{}
		switch typ {
		case "string":
			var raw []byte
			raw, err = redis.Bytes(c.Do("GET", k))
			v = string(raw)
			if id, ok := strings.CutPrefix(k, "{"+e.ns+"}:t:"); ok && err == nil {
				if r, derr := buckets.DecodeRecord(id, raw); derr == nil {
					v = fmt.Sprintf("%+v", *r)
				}
			}
		case "list":
			v, err = redis.Strings(c.Do("LRANGE", k, 0, -1))
		case "zset":
			v, err = redis.Strings(c.Do("ZRANGE", k, 0, -1, "WITHSCORES"))
		case "hash":
			v, err = redis.StringMap(c.Do("HGETALL", k))
		case "set":
			v, err = redis.Strings(c.Do("SMEMBERS", k))
		}
		t.Logf("dump: %s %s ttl %d: %q %v", k, typ, ttl, v, err)
	}
}

// lockedBuffer is a bytes.Buffer for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newEnv(t testing.TB, srv *redistest.Server) *env {
	t.Helper()
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	return &env{srv: srv, pool: srv.Pool(t), ns: ns, cfg: Config{Namespace: ns, Logger: testLogger(t), RetryDelay: func(*Task, int, error) time.Duration { return 10 * time.Millisecond }, Advanced: AdvancedConfig{IdleWait: time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: time.Second, ReapInterval: 100 * time.Millisecond, LeaseGrace: 500 * time.Millisecond}}}
}

// realEnv runs against a real redis-server restricted to the 2.4 table.
// With ENGINE_TEST_REDIS set it is that shared server, isolated by namespace.
func realEnv(t testing.TB) *env { return newEnv(t, redistest.Start(t)) }

// privateEnv is realEnv on a server of the test's own even when
// ENGINE_TEST_REDIS names a shared one: for tests that cut connections or
// count what the server sees.
func privateEnv(t testing.TB) *env { return newEnv(t, redistest.Start(t, redistest.Private())) }

// eachServer runs f against miniredis and a real server, in parallel.
func eachServer(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("miniredis", func(t *testing.T) { t.Parallel(); f(t, newEnv(t, redistest.Mini(t))) })
	t.Run("redis", func(t *testing.T) { t.Parallel(); f(t, realEnv(t)) })
}

func (e *env) client(t testing.TB) *laneClient {
	t.Helper()
	c, err := newLaneClient(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// admin is an unguarded connection for inspecting keys.
func (e *env) admin(t testing.TB) redis.Conn { return e.srv.Admin(t) }

func (e *env) key(suffix string) string { return "{" + e.ns + "}:" + suffix }

// runBackground runs f in a goroutine until the test ends.
func runBackground(t testing.TB, f func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Stopped by the test before it got going (a worker that had not
		// registered yet, say) is what the test asked for, not a failure.
		if err := f(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
			t.Errorf("background: %v", err)
		}
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// outcomeWait bounds a wait for an outcome (runs done, a task moved, a
// server promoted) whose time is the machine's, not the engine's: a
// loaded machine runs tasks tens of times slower than an idle one, so it
// is generous and only decides how long a failure takes to report. A
// bound the test asserts (a wake-up before IdleWait) is checked on its
// own.
const outcomeWait = 3 * time.Minute

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, d, what, cond)
}

type redistestServer = redistest.Server

func miniServer(t testing.TB) *redistest.Server { return redistest.Mini(t) }

type bucketsRecord = buckets.Record

// tick lets time pass for key expiry on miniredis, whose TTLs move only
// when told to; a real server keeps its own time. It moves miniredis's
// TTLs by the real time since the last tick (10 ms at the first), so that
// a key lives there as long as on a real server: a dead worker's
// heartbeat expires after its TTL, and a live worker on a loaded machine
// keeps its own as long as it would on a real server (running the TTLs
// faster made a live worker whose beat came a few hundred milliseconds
// late look dead). Measured in real time, not in calls, so a loaded
// machine that polls less often does not slow the expiry a test waits
// for.
func (e *env) tick() {
	if e.srv.Mini == nil {
		return
	}
	e.tickMu.Lock()
	defer e.tickMu.Unlock()
	now := time.Now()
	d := 10 * time.Millisecond
	if !e.lastTick.IsZero() {
		d = now.Sub(e.lastTick)
	}
	e.lastTick = now
	e.srv.Mini.FastForward(d)
}

type redisPool = redis.Pool

var (
	redisDoWithTimeout      = redis.DoWithTimeout
	redisDoContext          = redis.DoContext
	redisReceiveContext     = redis.ReceiveContext
	redisReceiveWithTimeout = redis.ReceiveWithTimeout
	redisDial               = redis.Dial
	redisDialReadTimeout    = redis.DialReadTimeout
)

// slogCounting is a logger that counts records at Warn and above.
func slogCounting(n *atomic.Int32) *slog.Logger {
	return slog.New(countingHandler{n})
}

type countingHandler struct{ n *atomic.Int32 }

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// idOf is the id of a task just enqueued, for tests that need only that.
func idOf(info *TaskInfo, err error) (string, error) {
	if err != nil {
		return "", err
	}
	return info.ID, nil
}

// idsOf is the ids of tasks just enqueued.
func idsOf(infos []*TaskInfo, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(infos))
	for i, info := range infos {
		ids[i] = info.ID
	}
	return ids, nil
}

// blpopCounter counts the BLPOPs sent through it, for tests whose pools
// have no census.
type blpopCounter struct {
	redis.Conn
	n *atomic.Int32
}

func (c *blpopCounter) Do(cmd string, args ...interface{}) (interface{}, error) {
	if cmd == "BLPOP" {
		c.n.Add(1)
	}
	return c.Conn.Do(cmd, args...)
}

func (c *blpopCounter) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if cmd == "BLPOP" {
		c.n.Add(1)
	}
	return redis.DoWithTimeout(c.Conn, d, cmd, args...)
}

func (c *blpopCounter) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if cmd == "BLPOP" {
		c.n.Add(1)
	}
	return redis.DoContext(c.Conn, ctx, cmd, args...)
}

func (c *blpopCounter) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *blpopCounter) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

// shardSpec is a namespace's lanes for the tests: a pool per lane and the
// shard-map version (AdvancedConfig.MapVersion).
type shardSpec struct {
	Pools      []*redis.Pool
	MapVersion int64
}

// newShardedClient is NewClient over sh.
func newShardedClient(sh shardSpec, cfg Config) (*Client, error) {
	cfg.Advanced.MapVersion = sh.MapVersion
	return NewClient(cfg, sh.Pools...)
}

// newShardedServer is NewServer over sh.
func newShardedServer(sh shardSpec, cfg Config, h Handler, roles Roles) (*Server, error) {
	cfg.Advanced.MapVersion = sh.MapVersion
	return NewServer(cfg, h, roles, sh.Pools...)
}

// act applies a to task id through the lane's inspector and returns what
// it did.
func act(t testing.TB, c *laneClient, a Action, id string) ActionResult {
	t.Helper()
	res, err := c.inspector().Act(context.Background(), a, id)
	if err != nil {
		t.Fatalf("%s %s: %v", a, id, err)
	}
	return res
}

// retryDead revives dead letter id, failing t unless it did.
func retryDead(t testing.TB, c *laneClient, id string) {
	t.Helper()
	if res := act(t, c, ActionRetry, id); res.Done != 1 {
		t.Fatalf("retry dead letter %s: %+v, want it revived", id, res)
	}
}

// logSignal is a logger, passing records on to next, whose returned
// channel is closed at the first record whose message contains msg: for
// tests that wait for what the engine says it did.
func logSignal(next *slog.Logger, msg string) (*slog.Logger, <-chan struct{}) {
	h := &signalHandler{next: next.Handler(), msg: msg, once: &sync.Once{}, seen: make(chan struct{})}
	return slog.New(h), h.seen
}

type signalHandler struct {
	next slog.Handler
	msg  string
	once *sync.Once
	seen chan struct{}
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.once.Do(func() { close(h.seen) })
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *signalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	return &c
}

func (h *signalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	return &c
}
