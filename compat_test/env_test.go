package compat_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// envLog turns the engine's logs on (to the test log) when set.
const envLog = "COMPAT_TEST_LOG"

// kind is one server the scenario list runs on.
type kind struct {
	name string
	// shared is the server every scenario of this kind uses (nil: each
	// scenario starts its own, see server).
	shared *redistest.Server
	// census is every command the engine sent to servers of this kind, and
	// every violation of the Redis 2.4 rules.
	census *redis24.Census
	args   *argCensus
	// side decides which version behaviours are asserted (sides_test.go);
	// version is the server's redis_version (empty for miniredis).
	side    side
	version string

	mu     sync.Mutex
	ran    map[string]bool // scenarios that ran
	childV []string        // violations reported by child processes
}

// server returns the server a scenario runs on. miniredis servers are one
// per scenario: FastForward, which stands in for the passing of time for
// key expiry there, would otherwise expire the other scenarios' heartbeats.
func (k *kind) server(t *testing.T) *redistest.Server {
	if k.shared != nil {
		return k.shared
	}
	srv := redistest.Mini(t)
	t.Cleanup(func() {
		// Fold this server's census (the 2.4 hook's refusals) into the kind's.
		for _, v := range srv.Census.Violations() {
			k.census.RecordViolation(v)
		}
	})
	return srv
}

func (k *kind) isMini() bool { return k.shared == nil }

// env is one scenario's server, namespace and engine configuration.
type env struct {
	t      *testing.T
	kind   *kind
	srv    *redistest.Server
	ns     string
	cfg    engine.Config
	faults *faults // the seam of pool
	pool   *redis.Pool
	ctx    context.Context
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv(envLog) != "" {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// baseConfig is the configuration scenarios start from: short heartbeats
// and reap intervals so that recovery is quick, a fixed short backoff, and
// an IdleWait of one second.
func baseConfig(ns string, log *slog.Logger) engine.Config {
	return engine.Config{Namespace: ns, Logger: log, ShutdownTimeout: 5 * time.Second, RetryDelay: func(*engine.Task, int, error) time.Duration { return 10 * time.Millisecond }, Advanced: engine.AdvancedConfig{IdleWait: time.Second, HeartbeatInterval: 250 * time.Millisecond, HeartbeatTTL: 2 * time.Second, ReapInterval: 100 * time.Millisecond}}
}

// newEnv prepares a scenario on k: a fresh namespace, a guarded pool with
// a fault seam, and the cleanups that delete the namespace's keys and then
// check that none is left. Cleanups run last-in first-out, so everything a
// scenario starts after newEnv stops before its keys are deleted.
func newEnv(t *testing.T, k *kind) *env {
	t.Helper()
	srv := k.server(t)
	ns := redistest.Namespace(t)
	if cl := clusterOf(srv); cl != nil {
		srv = cl.forNamespace(ns) // cluster_test.go
	}
	t.Cleanup(func() { checkNoKeys(t, srv, ns) })
	t.Cleanup(func() { cleanupNamespace(t, srv, ns) })
	f := &faults{args: k.args}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, kind: k, srv: srv, ns: ns, cfg: baseConfig(ns, testLogger(t)), faults: f, ctx: ctx}
	e.pool = newPool(t, srv, k.census, f)
	return e
}

// dialServer dials srv as the engine's default user: no password on
// miniredis and on a server started by redistest (its default user has
// none, and only the 2.4 command table), ENGINE_TEST_REDIS_PASSWORD on an
// external one.
func dialServer(addr, password string) (redis.Conn, error) {
	return redis.Dial("tcp", addr,
		redis.DialConnectTimeout(redistest.ConnectTimeout),
		redis.DialReadTimeout(redistest.ReadTimeout),
		redis.DialWriteTimeout(redistest.WriteTimeout),
		redis.DialPassword(password))
}

func serverPassword(srv *redistest.Server) string {
	if srv.Kind == redistest.KindExternal {
		return os.Getenv(redistest.EnvPassword)
	}
	return ""
}

// violationReporter fails t for each violation, but never after t ended.
type violationReporter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func newViolationReporter(t testing.TB) *violationReporter {
	r := &violationReporter{t: t}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.done = true
	})
	return r
}

func (r *violationReporter) report(v *redis24.Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.t.Errorf("command not valid for Redis 2.4: %v (sent: %s %s)", v, v.Command, strings.Join(v.Args, " "))
	}
}

// newPool is redistest's Server.Pool with the fault seam in front: every
// connection is redis24.Wrap'ed (refusing and recording anything Redis 2.4
// would not accept, counting every command in census), then wrapped by f.
func newPool(t testing.TB, srv *redistest.Server, census *redis24.Census, f *faults) *redis.Pool {
	rep := newViolationReporter(t)
	if cl := clusterOf(srv); cl != nil {
		return cl.pool(t, census, f, rep) // cluster_test.go
	}
	password := serverPassword(srv)
	p := &redis.Pool{
		MaxIdle:     16,
		IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) {
			c, err := dialServer(srv.Addr, password)
			if err != nil {
				return nil, err
			}
			g := redis24.Wrap(c, redis24.OnViolation(rep.report), redis24.WithCensus(census))
			return f.wrap(g), nil
		},
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// keyPatterns are the KEYS patterns that find a namespace's keys: the
// engine's "{ns}:..." and anything else that starts with the namespace.
func keyPatterns(ns string) []string { return []string{"{" + ns + "}*", ns + "*"} }

// cleanupNamespace deletes the namespace's keys: on an external server with
// redistest's Cleanup (KEYS then DEL, nothing else), on the servers the
// suite started by the same means on an admin connection.
func cleanupNamespace(t testing.TB, srv *redistest.Server, ns string) {
	if srv.Kind == redistest.KindExternal {
		srv.Cleanup(t, ns)
		return
	}
	c := adminConn(t, srv, ns)
	for _, p := range keyPatterns(ns) {
		keys, err := redis.Strings(c.Do("KEYS", p))
		if err != nil {
			t.Errorf("cleanup: KEYS %s: %v", p, err)
			return
		}
		if len(keys) > 0 {
			if _, err := c.Do("DEL", redis.Args{}.AddFlat(keys)...); err != nil {
				t.Errorf("cleanup: DEL: %v", err)
			}
		}
	}
}

// checkNoKeys fails t if a key of the namespace is left.
func checkNoKeys(t testing.TB, srv *redistest.Server, ns string) {
	c := adminConn(t, srv, ns)
	for _, p := range keyPatterns(ns) {
		keys, err := redis.Strings(c.Do("KEYS", p))
		if err != nil {
			t.Errorf("check for leftover keys: KEYS %s: %v", p, err)
			continue
		}
		if len(keys) > 0 {
			t.Errorf("%d keys of namespace %s left after cleanup: %v", len(keys), ns, keys)
		}
	}
}

// key names a key of the namespace, for the few scenarios that inspect or
// damage the engine's keys from outside (docs/design.md has the schema).
func (e *env) key(suffix string) string { return "{" + e.ns + "}:" + suffix }

func (e *env) admin() redis.Conn { return adminConn(e.t, e.srv, e.ns) }

// adminConn is srv's admin connection, on a cluster one that reaches the
// master of the namespace's slot.
func adminConn(t testing.TB, srv *redistest.Server, ns string) redis.Conn {
	if cl := clusterOf(srv); cl != nil {
		return cl.admin(t, ns)
	}
	return srv.Admin(t)
}

// exists reports whether key exists, asked on an admin connection (which
// is not counted in the census and does not touch anyone's WATCH).
func (e *env) exists(c redis.Conn, key string) bool {
	n, err := redis.Int(c.Do("EXISTS", key))
	if err != nil {
		e.t.Errorf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// passTime lets d of key-expiry time pass: on miniredis, whose TTLs only
// run down with FastForward, it fast-forwards; real servers expire keys on
// their own clock, so it does nothing there.
func (e *env) passTime(d time.Duration) {
	if e.kind.isMini() {
		e.srv.Mini.FastForward(d)
	}
}

// waitKeyGone waits until key no longer exists, letting key-expiry time pass.
func (e *env) waitKeyGone(key string, timeout time.Duration) {
	e.t.Helper()
	c := e.admin()
	testwait.Until(e.t, timeout, "key "+key+" to expire", func() bool {
		if !e.exists(c, key) {
			return true
		}
		e.passTime(250 * time.Millisecond)
		return false
	})
}

// ctxTimeout is the scenario's context with a timeout.
func (e *env) ctxTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, d)
}

func (e *env) client() *engine.Client {
	e.t.Helper()
	c, err := engine.NewClient(e.cfg, e.pool)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// run runs f in a goroutine until stop is called or the scenario ends; f
// must return when its context ends. stop waits for f to return.
func (e *env) run(what string, f func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(ctx); err != nil {
			e.t.Errorf("%s: %v", what, err)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				e.t.Errorf("%s did not return within 30s of its context ending", what)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// server starts an engine.Server with every role over the scenario's pool.
func (e *env) server(cfg engine.Config, h engine.Handler) (*engine.Server, func()) {
	e.t.Helper()
	s, err := engine.NewServer(cfg, h, engine.AllRoles, e.pool)
	if err != nil {
		e.t.Fatal(err)
	}
	return s, e.run("server", s.Run)
}

func (e *env) worker(cfg engine.Config, h engine.Handler) (enginehook.Worker, func()) {
	e.t.Helper()
	w, err := enginehook.NewWorker(e.pool, cfg, h)
	if err != nil {
		e.t.Fatal(err)
	}
	return w, e.run("worker", w.Run)
}

func (e *env) dispatcher(cfg engine.Config) (enginehook.Dispatcher, func()) {
	e.t.Helper()
	d, err := enginehook.NewDispatcher(e.pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return d, e.run("dispatcher", d.Run)
}

func (e *env) reaper(cfg engine.Config) (enginehook.Reaper, func()) {
	e.t.Helper()
	r, err := enginehook.NewReaper(e.pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return r, e.run("reaper", r.Run)
}

// inspector returns an Inspector over the scenario's pool.
func (e *env) inspector() *engine.Inspector {
	e.t.Helper()
	in, err := engine.NewInspector(e.cfg, e.pool)
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

// stats returns queue q's figures (zero if the queue is unknown).
func (e *env) stats(q string) engine.QueueInfo {
	e.t.Helper()
	all, err := e.inspector().Queues(e.ctx)
	if err != nil {
		e.t.Fatalf("Queues: %v", err)
	}
	for _, s := range all {
		if s.Queue == q {
			return s
		}
	}
	return engine.QueueInfo{Queue: q}
}

// expectStats waits (up to outcomeWait: a worker may still be recording
// its last result) until queue q's figures satisfy ok, and fails t with
// the last figures read if they never do.
func (e *env) expectStats(q string, want string, ok func(engine.QueueInfo) bool) {
	e.t.Helper()
	var st engine.QueueInfo
	held := false
	defer func() {
		if !held {
			e.t.Logf("queue %s stats %+v: want %s", q, st, want)
		}
	}()
	testwait.Until(e.t, outcomeWait, fmt.Sprintf("queue %s stats: %s", q, want), func() bool {
		st = e.stats(q)
		return ok(st)
	})
	held = true
}

// lookup returns a task's info, failing the test on error.
func (e *env) lookup(c *engine.Client, id string) *engine.TaskInfo {
	e.t.Helper()
	info, err := c.Lookup(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Lookup %s: %v", id, err)
	}
	return info
}

// run is one handler run as the handler saw it.
type run struct {
	ID, Type, Queue string
	Payload         string
	Attempt         int
	Recoveries      int
	LastError       string
	Due             time.Time
	At              time.Time // when the handler started, on the real clock
}

// recorder keeps every handler run of a scenario.
type recorder struct {
	mu   sync.Mutex
	runs []run
}

func (r *recorder) add(t *engine.Task) run {
	x := run{ID: t.ID, Type: t.Type, Queue: t.Queue, Payload: string(t.Payload), Attempt: t.Attempt,
		Recoveries: t.Recoveries, LastError: t.LastError, Due: t.Due, At: time.Now()}
	r.mu.Lock()
	r.runs = append(r.runs, x)
	r.mu.Unlock()
	return x
}

// handler records each run and returns nil.
func (r *recorder) handler() engine.HandlerFunc {
	return func(ctx context.Context, t *engine.Task) error {
		r.add(t)
		return nil
	}
}

func (r *recorder) all() []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]run(nil), r.runs...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

// of returns the runs of task id, in order.
func (r *recorder) of(id string) []run {
	var out []run
	for _, x := range r.all() {
		if x.ID == id {
			out = append(out, x)
		}
	}
	return out
}

// counts returns how many times each task ran.
func (r *recorder) counts() map[string]int {
	m := map[string]int{}
	for _, x := range r.all() {
		m[x.ID]++
	}
	return m
}

// outcomeWait bounds a wait for an outcome (runs done, figures reached)
// whose time is the machine's, not the engine's: a loaded machine (the
// whole suite under the race detector on two shared cores) runs a
// scenario's tasks tens of times slower than an idle one, so it is
// generous; it only decides how long a failure takes to report. A bound
// that a scenario asserts (a latency, a recovery time) is checked on its
// own.
const outcomeWait = 3 * time.Minute

// waitRuns waits (up to outcomeWait) until n runs were recorded, then a
// quiet period in which no more may come (a duplicate would show up there).
func (r *recorder) waitRuns(t testing.TB, n int) {
	t.Helper()
	testwait.Until(t, outcomeWait, fmt.Sprintf("%d handler runs", n), func() bool { return r.len() >= n })
	// real time: a duplicate (a second move, a recovery after a lost
	// reply) has no event of its own; it would show in this quiet period.
	time.Sleep(300 * time.Millisecond)
	if got := r.len(); got != n {
		t.Errorf("%d handler runs, want exactly %d", got, n)
	}
}

// exactlyOnce fails t unless every id ran exactly once and nothing else ran.
func (r *recorder) exactlyOnce(t testing.TB, ids []string) {
	t.Helper()
	counts := r.counts()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
		if counts[id] != 1 {
			t.Errorf("task %s ran %d times, want exactly once", id, counts[id])
		}
	}
	for id, n := range counts {
		if !want[id] {
			t.Errorf("unexpected task %s ran %d times", id, n)
		}
	}
}

// must(t)(c.Enqueue(...)) returns the id, failing t on error.
func must(t testing.TB) func(info *engine.TaskInfo, err error) string {
	return func(info *engine.TaskInfo, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		return info.ID
	}
}

// idsOf is the ids of tasks just enqueued.
func idsOf(infos []*engine.TaskInfo, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(infos))
	for i, info := range infos {
		ids[i] = info.ID
	}
	return ids, nil
}

// heldClaims beats p each time a transaction counts a claim given back
// for flow control (a slot or a window in use): proof that a worker tried
// to take a task while the limit held it.
func (e *env) heldClaims(p *testwait.Pulse) {
	e.faults.set(func(f *faults) {
		f.beforeExec = func(v txnView) {
			for _, c := range v.Queued {
				if c.is("HINCRBY") && len(c.Args) > 1 && argString(c.Args[1]) == "held" {
					p.Beat()
				}
			}
		}
	})
}

// blocking counts the blocking pops in flight (sent, not answered yet) on
// the pool's connections: the dispatchers' on the wake list, the workers'
// on the queues' wake-up lists. changed beats at each change.
type blocking struct {
	dispatchers, workers atomic.Int64
	changed              testwait.Pulse
}

// trackBlocking sets the seam's Do hooks to count e's blocking pops.
func (e *env) trackBlocking() *blocking {
	b := &blocking{}
	count := func(c cmd) *atomic.Int64 {
		if !c.is("BLPOP") {
			return nil
		}
		for _, a := range c.Args {
			switch s := argString(a); {
			case strings.HasSuffix(s, "}:wake"):
				return &b.dispatchers
			case strings.Contains(s, "}:n:"):
				return &b.workers
			}
		}
		return nil
	}
	e.faults.set(func(f *faults) {
		f.beforeDo = func(c cmd) {
			if n := count(c); n != nil {
				n.Add(1)
				b.changed.Beat()
			}
		}
		f.afterDo = func(c cmd, _ interface{}) {
			if n := count(c); n != nil {
				n.Add(-1)
				b.changed.Beat()
			}
		}
	})
	return b
}
