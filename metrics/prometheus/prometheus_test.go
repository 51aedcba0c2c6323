package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/metrics/prometheus"
	"github.com/gomodule/redigo/redis"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func baseConfig(t *testing.T, srv *redistest.Server) engine.Config {
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	return engine.Config{Namespace: ns, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Concurrency: 4, RetryDelay: func(*engine.Task, int, error) time.Duration { return 10 * time.Millisecond }, Advanced: engine.AdvancedConfig{IdleWait: time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: time.Second, ReapInterval: 100 * time.Millisecond}}
}

// scrape GETs url and parses the text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value returns the value of family name's series whose labels include
// every pair of labels (counter, gauge, or a histogram's sample count);
// -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// ledger records what the handlers did.
type ledger struct {
	mu       sync.Mutex
	ok, fail map[string]int // by type
	runs     int
	done     chan struct{}
	want     int // successes plus deaths to wait for
	settled  int
}

func (l *ledger) add(typ string, failed, final bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs++
	if failed {
		l.fail[typ]++
	} else {
		l.ok[typ]++
	}
	if final {
		l.settled++
		if l.settled == l.want {
			close(l.done)
		}
	}
}

// TestScrapeDuringRun runs tasks of three kinds (succeed, fail once then
// succeed, fail permanently) on a real server with the collector as the
// observer, scrapes /metrics while they run and after, and checks the
// counters against the handlers' ledger and the gauges against Redis.
func TestScrapeDuringRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	cfg := baseConfig(t, srv)
	const nOK, nFlaky, nBad, nLater = 30, 10, 5, 7
	led := &ledger{ok: map[string]int{}, fail: map[string]int{}, done: make(chan struct{}), want: nOK + nFlaky + nBad}
	col := prometheus.New(prometheus.Options{Inspector: inspector(t, cfg, pool), CacheTTL: time.Nanosecond})
	// Each run's result is counted by its EventFinished (and a bad task's
	// burial by its EventDead) after its handler returned: recorded
	// closes once the collector has seen every one of them.
	var seen atomic.Int64
	recorded := make(chan struct{})
	const wantEvents = nOK + 2*nFlaky + nBad + nBad
	cfg.Observer = engine.ObserverFunc(func(e engine.Event) {
		col.Observe(e)
		if e.Kind == engine.EventFinished || e.Kind == engine.EventDead {
			if seen.Add(1) == wantEvents {
				close(recorded)
			}
		}
	})
	client, err := engine.NewClient(cfg, pool) // the producer reports enqueues too
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(col.Handler())
	defer hs.Close()

	mux := engine.NewMux()
	mux.HandleFunc("ok", func(ctx context.Context, task *engine.Task) error {
		led.add("ok", false, true)
		return nil
	})
	mux.HandleFunc("flaky", func(ctx context.Context, task *engine.Task) error {
		if task.Attempt == 1 {
			led.add("flaky", true, false)
			return errors.New("first attempt fails")
		}
		led.add("flaky", false, true)
		return nil
	})
	mux.HandleFunc("bad", func(ctx context.Context, task *engine.Task) error {
		led.add("bad", true, true)
		return engine.Permanent(errors.New("never works"))
	})
	ctx := t.Context()
	for typ, n := range map[string]int{"ok": nOK, "flaky": nFlaky, "bad": nBad} {
		for i := range n {
			if _, err := client.Enqueue(ctx, typ, []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range nLater {
		if _, err := client.Enqueue(ctx, "ok", nil, engine.In(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	in := inspector(t, cfg, pool)
	if err := in.SetQueueLimits(ctx, engine.QueueConfig{Name: "default", MaxRunning: 50}); err != nil {
		t.Fatal(err)
	}
	// Before any worker: the gauges show what waits.
	fams := scrape(t, hs.URL)
	if got := value(fams, "bucketq_queue_max_running", "queue", "default"); got != 50 {
		t.Errorf("max_running gauge = %v, want 50", got)
	}
	if got := value(fams, "bucketq_queue_slots_in_use", "queue", "default"); got != 0 {
		t.Errorf("slots_in_use gauge = %v, want 0", got)
	}
	if got := value(fams, "bucketq_queue_tasks", "queue", "default", "state", "ready"); got != nOK+nFlaky+nBad {
		t.Errorf("ready gauge before the run = %v, want %d", got, nOK+nFlaky+nBad)
	}
	if got := value(fams, "bucketq_queue_tasks", "queue", "default", "state", "scheduled"); got != nLater {
		t.Errorf("scheduled gauge = %v, want %d", got, nLater)
	}
	if got := value(fams, "bucketq_tasks_enqueued_total", "queue", "default", "type", "ok"); got != nOK+nLater {
		t.Errorf("enqueued{ok} = %v, want %d", got, nOK+nLater)
	}
	if got := value(fams, "bucketq_workers_alive"); got != 0 {
		t.Errorf("workers alive before the run = %v, want 0", got)
	}

	s, err := engine.NewServer(cfg, mux, engine.RoleDispatcher|engine.RoleReaper|engine.RoleWorker, pool)
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { runDone <- s.Run(runCtx) }()

	// A scrape while tasks run answers, and never counts more than ran.
	mid := scrape(t, hs.URL)
	led.mu.Lock()
	runsSoFar := led.runs
	led.mu.Unlock()
	if got := value(mid, "bucketq_task_run_duration_seconds"); got > float64(runsSoFar) && got != -1 {
		t.Errorf("mid-run: %v runs recorded, handlers ran %d", got, runsSoFar)
	}

	select {
	case <-led.done:
	case <-time.After(30 * time.Second):
		t.Fatal("tasks did not all settle")
	}
	select {
	case <-recorded:
	case <-time.After(30 * time.Second):
		t.Fatalf("the collector saw %d finish and dead events, want %d", seen.Load(), wantEvents)
	}
	led.mu.Lock()
	want := map[string][3]float64{}
	for _, typ := range []string{"ok", "flaky", "bad"} {
		want[typ] = [3]float64{float64(led.ok[typ]), float64(led.fail[typ]), float64(led.ok[typ] + led.fail[typ])}
	}
	led.mu.Unlock()
	if total, n := float64(nOK+2*nFlaky+nBad), want["ok"][2]+want["flaky"][2]+want["bad"][2]; n != total {
		t.Errorf("the handlers ran %v times, want %v", n, total)
	}
	read := func(typ string) [3]float64 {
		return [3]float64{
			max(0, value(fams, "bucketq_tasks_processed_total", "queue", "default", "type", typ)),
			max(0, value(fams, "bucketq_tasks_failed_total", "queue", "default", "type", typ)),
			max(0, value(fams, "bucketq_task_run_duration_seconds", "queue", "default", "type", typ)),
		}
	}
	fams = scrape(t, hs.URL)
	for _, typ := range []string{"ok", "flaky", "bad"} {
		got, w := read(typ), want[typ]
		for i, name := range []string{"processed", "failed", "run duration count"} {
			if got[i] != w[i] {
				t.Errorf("%s{%s} = %v, ledger %v", name, typ, got[i], w[i])
			}
		}
	}
	if got := value(fams, "bucketq_tasks_retried_total", "type", "flaky"); got != nFlaky {
		t.Errorf("retried{flaky} = %v, want %d", got, nFlaky)
	}
	if got := value(fams, "bucketq_tasks_dead_total", "type", "bad", "reason", "failed"); got != nBad {
		t.Errorf("dead{bad} = %v, want %d", got, nBad)
	}
	if got := value(fams, "bucketq_task_lateness_seconds", "queue", "default"); got != float64(led.runs) {
		t.Errorf("lateness count = %v, want %d starts", got, led.runs)
	}
	// Retries went through buckets: the dispatcher moved each.
	if got := value(fams, "bucketq_dispatcher_moved_tasks_total"); got < nFlaky {
		t.Errorf("dispatcher moved %v, want at least the %d retries", got, nFlaky)
	}
	for state, want := range map[string]int{"ready": 0, "running": 0, "dead": nBad, "scheduled": nLater} {
		if got := value(fams, "bucketq_queue_tasks", "queue", "default", "state", state); got != float64(want) {
			t.Errorf("queue_tasks{%s} = %v, want %d", state, got, want)
		}
	}
	if got := value(fams, "bucketq_workers_alive"); got != 1 {
		t.Errorf("workers alive = %v, want 1", got)
	}
	if got := value(fams, "bucketq_redis_stats_up"); got != 1 {
		t.Errorf("stats_up = %v, want 1", got)
	}
	stop()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	redistest.RequireNoViolations(t, srv)
}

// censusTotal sums the commands srv's census counted.
func censusTotal(srv *redistest.Server) int {
	n := 0
	for _, c := range srv.Census.Commands() {
		n += srv.Census.Count(c)
	}
	return n
}

// TestScrapeCostBounded: a scrape sends as many commands with ten times
// as many tasks, and none while its reading is cached.
func TestScrapeCostBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Private())
	pool := srv.Pool(t)
	cfg := baseConfig(t, srv)
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	fresh := prometheus.New(prometheus.Options{Inspector: inspector(t, cfg, pool), CacheTTL: time.Nanosecond})
	cached := prometheus.New(prometheus.Options{Inspector: inspector(t, cfg, pool), CacheTTL: time.Hour})
	freshSrv, cachedSrv := httptest.NewServer(fresh.Handler()), httptest.NewServer(cached.Handler())
	defer freshSrv.Close()
	defer cachedSrv.Close()
	enqueue := func(n int) {
		var batch []engine.NewTask
		for i := range n {
			opts := []engine.Option{}
			if i%2 == 1 {
				opts = append(opts, engine.In(time.Hour))
			}
			batch = append(batch, engine.NewTask{Type: "t", Payload: []byte("x"), Options: opts})
		}
		if _, err := client.EnqueueBatch(t.Context(), batch); err != nil {
			t.Fatal(err)
		}
	}
	cost := func(url string) int {
		before := censusTotal(srv)
		scrape(t, url)
		return censusTotal(srv) - before
	}
	enqueue(10)
	small := cost(freshSrv.URL)
	enqueue(990)
	large := cost(freshSrv.URL)
	if small == 0 || large != small {
		t.Errorf("a scrape sent %d commands with 10 tasks and %d with 1000; want the same, not zero", small, large)
	}
	cost(cachedSrv.URL) // fills the cache
	if n := cost(cachedSrv.URL); n != 0 {
		t.Errorf("a cached scrape sent %d commands, want 0", n)
	}
	redistest.RequireNoViolations(t, srv)
}

// TestHotPathNoCommandPerTask runs the same N tasks with and without the
// collector as observer and compares the commands sent: the observer may
// not add one per task.
func TestHotPathNoCommandPerTask(t *testing.T) {
	t.Parallel()
	const n = 200
	run := func(withObserver bool) int {
		srv := redistest.Start(t, redistest.Private())
		pool := srv.Pool(t)
		cfg := baseConfig(t, srv)
		cfg.Advanced.HeartbeatInterval, cfg.Advanced.HeartbeatTTL, cfg.Advanced.IdleWait = 10*time.Second, 30*time.Second, 20*time.Second
		// Batch claim and group commit send a number of commands that
		// depends on timing (how many tasks a pop or a window finds):
		// off, the two runs differ by what the observer sends alone.
		cfg.Advanced.ClaimBatch, cfg.Advanced.GroupCommitWindow = 1, -1
		if withObserver {
			cfg.Observer = prometheus.New(prometheus.Options{})
		}
		client, err := engine.NewClient(cfg, pool)
		if err != nil {
			t.Fatal(err)
		}
		var done sync.WaitGroup
		done.Add(n)
		mux := engine.NewMux()
		mux.HandleFunc("t", func(context.Context, *engine.Task) error { done.Done(); return nil })
		var batch []engine.NewTask
		for range n {
			batch = append(batch, engine.NewTask{Type: "t"})
		}
		before := censusTotal(srv)
		if _, err := client.EnqueueBatch(t.Context(), batch); err != nil {
			t.Fatal(err)
		}
		w, err := enginehook.NewWorker(pool, cfg, mux)
		if err != nil {
			t.Fatal(err)
		}
		runDone := make(chan error, 1)
		go func() { runDone <- w.Run(context.Background()) }()
		done.Wait()
		// The last results are recorded after their handlers return; an
		// observer would tell, but the run without one must have none.
		testwait.Until(t, time.Minute, "every result recorded", func() bool { return w.Processed() >= n })
		if err := w.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := <-runDone; err != nil {
			t.Fatal(err)
		}
		return censusTotal(srv) - before
	}
	without := run(false)
	with := run(true)
	t.Logf("%d tasks: %d commands without the observer, %d with", n, without, with)
	if with-without >= n/2 {
		t.Errorf("with the observer %d commands, without %d: more than one per two tasks for %d tasks", with, without, n)
	}
}

// TestLint checks the metric names and help against the client library's
// linter, with every family present.
func TestLint(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := baseConfig(t, srv)
	client, err := engine.NewClient(cfg, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	col := prometheus.New(prometheus.Options{Inspector: inspector(t, cfg, srv.Pool(t))})
	now := time.Now()
	for _, e := range []engine.Event{
		{Kind: engine.EventEnqueued, Queue: "q", Type: "t"},
		{Kind: engine.EventStarted, Queue: "q", Type: "t", Time: now, Due: now.Add(-time.Second)},
		{Kind: engine.EventFinished, Queue: "q", Type: "t", State: engine.StateDone, Duration: time.Second},
		{Kind: engine.EventFinished, Queue: "q", Type: "t", State: engine.StateRetrying, Duration: time.Second},
		{Kind: engine.EventDead, Queue: "q", Type: "t", Reason: "failed"},
		{Kind: engine.EventRecovered, Queue: "q", Type: "t", Reason: "worker_died"},
		{Kind: engine.EventDispatched, Moved: 3, Conflicts: 1},
	} {
		col.Observe(e)
	}
	if _, err := client.Enqueue(t.Context(), "t", nil); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(col); n < 12 {
		t.Errorf("collected %d series, want every family present", n)
	}
}

// inspector is an Inspector over pool for cfg's namespace.
func inspector(t testing.TB, cfg engine.Config, pool *redis.Pool) *engine.Inspector {
	t.Helper()
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	return in
}
