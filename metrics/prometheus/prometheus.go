// Package prometheus exports the engine's metrics to Prometheus. Import it
// only if you want it: the engine itself depends on no metrics library.
//
// A Collector is two things: an engine.Observer, which counts what this
// process saw happen (tasks enqueued, run, failed, retried, dead,
// recovered; run durations and lateness; dispatcher moves and conflicts)
// in memory, without a Redis command; and a prometheus.Collector, which
// reports those, and reads queue sizes, the age of the oldest ready task
// and the workers alive from Redis when scraped. The Redis reads are
// cached for Options.CacheTTL, so scrapes cost a bounded number of
// commands whatever the number of tasks: one SMEMBERS and one pipelined
// round of three commands per queue, one ZRANGE of the schedule index
// (engine.Inspector.Queues), and one SMEMBERS and one MULTI/EXEC of five
// commands per worker process (engine.Inspector.Workers).
//
//	col := prometheus.New(prometheus.Options{Inspector: inspector})
//	cfg.Observer = col // before NewServer and NewClient
//	http.Handle("/metrics", col.Handler())
//
// Counters are of this process since it started, as Prometheus expects
// (sum them over processes in queries); the queue gauges are of the whole
// namespace, read from Redis.
package prometheus

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/bucketq/bucketq/engine"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what the collector reads the Redis gauges from: an
// *engine.Inspector, whose figures span every lane.
type Source interface {
	Queues(ctx context.Context) ([]engine.QueueInfo, error)
	Workers(ctx context.Context) ([]engine.WorkerInfo, error)
}

// Options configures New. Zero fields take the defaults beside them.
type Options struct {
	// Inspector reads the queue gauges and the workers alive from Redis
	// at scrape time. Nil: no Redis gauges, only the in-process counters.
	Inspector Source
	// CacheTTL is how long Redis readings are reused between scrapes.
	// Default 5 s.
	CacheTTL time.Duration
	// Timeout bounds the Redis reads of one scrape. Default 3 s.
	Timeout time.Duration
	// DurationBuckets are the upper bounds (seconds) of the run duration
	// histogram. Default: 5 ms to about 10 minutes, exponential.
	DurationBuckets []float64
	// LatenessBuckets are the upper bounds (seconds) of the lateness
	// histogram. Default: 1 ms to about 1 hour, exponential.
	LatenessBuckets []float64
}

// Collector counts the engine's events and reads its gauges. Make one
// with New; it is safe for concurrent use.
type Collector struct {
	opts Options

	enqueued, processed, failed, retried, snoozed, dead *prom.CounterVec
	recovered                                           *prom.CounterVec
	duration, lateness                                  *prom.HistogramVec
	moved, conflicts                                    prom.Counter

	queueTasks, oldestReady, workersAlive, statsUp *prom.Desc
	maxRunning, slotsInUse, keysWaiting            *prom.Desc

	mu   sync.Mutex // held for a refresh: one at a time, others wait and share it
	read time.Time  // when snap was taken
	snap snapshot
}

type snapshot struct {
	stats      []engine.QueueInfo
	statsOK    bool
	alive      int
	workersOK  bool
	statsErr   error
	workersErr error
}

// New returns a Collector.
func New(opts Options) *Collector {
	if in, ok := opts.Inspector.(*engine.Inspector); ok && in == nil {
		opts.Inspector = nil
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = 5 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 3 * time.Second
	}
	if opts.DurationBuckets == nil {
		opts.DurationBuckets = prom.ExponentialBuckets(0.005, 2.5, 14)
	}
	if opts.LatenessBuckets == nil {
		opts.LatenessBuckets = prom.ExponentialBuckets(0.001, 3, 16)
	}
	qt := []string{"queue", "type"}
	counter := func(name, help string, labels ...string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Namespace: "bucketq", Name: name, Help: help}, labels)
	}
	return &Collector{
		opts:      opts,
		enqueued:  counter("tasks_enqueued_total", "Tasks this process enqueued.", qt...),
		processed: counter("tasks_processed_total", "Task runs in this process that succeeded.", qt...),
		failed:    counter("tasks_failed_total", "Task runs in this process that failed (to be retried, or dead).", qt...),
		retried:   counter("tasks_retried_total", "Failed task runs in this process scheduled to run again.", qt...),
		snoozed:   counter("tasks_snoozed_total", "Task runs in this process whose handler snoozed the task (not failures).", qt...),
		dead:      counter("tasks_dead_total", "Tasks this process sent to the dead letters, by reason (failed: the last attempt failed or the error was permanent; recovered_too_often; snoozed_too_often).", "queue", "type", "reason"),
		recovered: counter("tasks_recovered_total", "Running tasks this process returned to their queues, by reason (worker_died, lease_expired).", "queue", "type", "reason"),
		duration: prom.NewHistogramVec(prom.HistogramOpts{Namespace: "bucketq", Name: "task_run_duration_seconds",
			Help: "Time from a task's claim to its recorded result, in this process.", Buckets: opts.DurationBuckets}, qt),
		lateness: prom.NewHistogramVec(prom.HistogramOpts{Namespace: "bucketq", Name: "task_lateness_seconds",
			Help: "Time from a task's due time to its start, in this process.", Buckets: opts.LatenessBuckets}, []string{"queue"}),
		moved: prom.NewCounter(prom.CounterOpts{Namespace: "bucketq", Name: "dispatcher_moved_tasks_total",
			Help: "Tasks this process's dispatcher made ready."}),
		conflicts: prom.NewCounter(prom.CounterOpts{Namespace: "bucketq", Name: "dispatcher_conflicts_total",
			Help: "Dispatcher transactions in this process that found their buckets changed by another and were left for later."}),
		queueTasks: prom.NewDesc("bucketq_queue_tasks", "Tasks of a queue by state (disjoint: a retry waiting in its bucket is retrying, a due one ready), read from Redis.",
			[]string{"queue", "state"}, nil),
		oldestReady: prom.NewDesc("bucketq_queue_oldest_ready_age_seconds", "How long the oldest ready task of a queue has been due, read from Redis.",
			[]string{"queue"}, nil),
		maxRunning: prom.NewDesc("bucketq_queue_max_running", "A queue's concurrency limit (0: none), read from Redis.",
			[]string{"queue"}, nil),
		slotsInUse: prom.NewDesc("bucketq_queue_slots_in_use", "Slots of a queue's concurrency limit that running tasks hold, read from Redis.",
			[]string{"queue"}, nil),
		keysWaiting: prom.NewDesc("bucketq_queue_keys_waiting", "Keys of a queue with tasks waiting in turn (one list each), read from Redis; no series per key.",
			[]string{"queue"}, nil),
		workersAlive: prom.NewDesc("bucketq_workers_alive", "Worker processes whose heartbeat is alive, read from Redis.", nil, nil),
		statsUp:      prom.NewDesc("bucketq_redis_stats_up", "1 if the last reading of the gauges from Redis succeeded, else 0.", nil, nil),
	}
}

// Observe counts one engine event; it is the engine.Observer side. It
// takes no lock of its own and sends no command.
func (c *Collector) Observe(e engine.Event) {
	switch e.Kind {
	case engine.EventEnqueued:
		c.enqueued.WithLabelValues(e.Queue, e.Type).Inc()
	case engine.EventStarted:
		c.lateness.WithLabelValues(e.Queue).Observe(max(0, e.Time.Sub(e.Due).Seconds()))
	case engine.EventFinished:
		c.duration.WithLabelValues(e.Queue, e.Type).Observe(e.Duration.Seconds())
		switch {
		case e.State == engine.StateDone:
			c.processed.WithLabelValues(e.Queue, e.Type).Inc()
		case e.State == engine.StateScheduled:
			c.snoozed.WithLabelValues(e.Queue, e.Type).Inc()
		case e.State == engine.StateRetrying:
			c.failed.WithLabelValues(e.Queue, e.Type).Inc()
			c.retried.WithLabelValues(e.Queue, e.Type).Inc()
		case e.State == engine.StateDead:
			c.failed.WithLabelValues(e.Queue, e.Type).Inc()
		}
	case engine.EventDead:
		c.dead.WithLabelValues(e.Queue, e.Type, e.Reason).Inc()
	case engine.EventRecovered:
		c.recovered.WithLabelValues(e.Queue, e.Type, e.Reason).Inc()
	case engine.EventDispatched:
		c.moved.Add(float64(e.Moved))
		c.conflicts.Add(float64(e.Conflicts))
	}
}

func (c *Collector) vecs() []prom.Collector {
	return []prom.Collector{c.enqueued, c.processed, c.failed, c.retried, c.snoozed, c.dead, c.recovered,
		c.duration, c.lateness, c.moved, c.conflicts}
}

// Describe sends the descriptors of every metric (prometheus.Collector).
func (c *Collector) Describe(ch chan<- *prom.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	if c.opts.Inspector != nil {
		ch <- c.queueTasks
		ch <- c.oldestReady
		ch <- c.maxRunning
		ch <- c.slotsInUse
		ch <- c.keysWaiting
		ch <- c.workersAlive
		ch <- c.statsUp
	}
}

// Collect sends every metric (prometheus.Collector), reading the gauges
// from Redis unless the last reading is younger than CacheTTL.
func (c *Collector) Collect(ch chan<- prom.Metric) {
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
	if c.opts.Inspector == nil {
		return
	}
	s := c.reading()
	up := 0.0
	if s.statsOK && s.workersOK {
		up = 1
	}
	ch <- prom.MustNewConstMetric(c.statsUp, prom.GaugeValue, up)
	if s.workersOK {
		ch <- prom.MustNewConstMetric(c.workersAlive, prom.GaugeValue, float64(s.alive))
	}
	for _, q := range s.stats {
		for _, st := range []struct {
			state string
			n     int64
		}{{"scheduled", q.Scheduled}, {"ready", q.Ready}, {"running", q.Running}, {"retrying", q.Retrying}, {"dead", q.Dead}} {
			ch <- prom.MustNewConstMetric(c.queueTasks, prom.GaugeValue, float64(st.n), q.Queue, st.state)
		}
		ch <- prom.MustNewConstMetric(c.oldestReady, prom.GaugeValue, q.Latency.Seconds(), q.Queue)
		ch <- prom.MustNewConstMetric(c.maxRunning, prom.GaugeValue, float64(q.MaxRunning), q.Queue)
		ch <- prom.MustNewConstMetric(c.slotsInUse, prom.GaugeValue, float64(q.SlotsInUse), q.Queue)
		ch <- prom.MustNewConstMetric(c.keysWaiting, prom.GaugeValue, float64(q.KeysWaiting), q.Queue)
	}
}

// reading returns the cached Redis reading, refreshed when older than
// CacheTTL. Concurrent scrapes wait for one refresh.
func (c *Collector) reading() snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read.IsZero() && time.Since(c.read) < c.opts.CacheTTL {
		return c.snap
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	var s snapshot
	s.stats, s.statsErr = c.opts.Inspector.Queues(ctx)
	s.statsOK = s.statsErr == nil
	var ws []engine.WorkerInfo
	ws, s.workersErr = c.opts.Inspector.Workers(ctx)
	for _, w := range ws {
		if w.Alive {
			s.alive++
		}
	}
	s.workersOK = s.workersErr == nil
	c.snap, c.read = s, time.Now()
	return s
}

// Handler returns an http.Handler that serves this collector's metrics
// and the Go runtime's and process's in the Prometheus text format, from
// a registry of its own. Mount it at /metrics.
func (c *Collector) Handler() http.Handler {
	reg := prom.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
