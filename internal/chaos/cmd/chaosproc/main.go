// Command chaosproc is one process of a chaos run (see package chaos): a
// producer, a dispatcher, a worker, a reaper or a periodic scheduler of the engine, configured by
// flags, that the harness starts, kills and restarts.
//
//	chaosproc -mode producer   -addr A -ns N -ledger F -count 1000 -rate 500 ...
//	chaosproc -mode worker     -addr A -ns N -ledger F -idfile F -concurrency 8 ...
//	chaosproc -mode dispatcher -addr A -ns N
//	chaosproc -mode reaper     -addr A -ns N
//	chaosproc -mode scheduler  -addr A -ns N -entry E -every 1s -offset 2s
//
// Producers append acknowledged enqueues to their ledger; workers' handlers
// append the runs they start and end (package chaos/ledger). Logs are JSON
// on stderr. SIGTERM or SIGINT stops a process gracefully; the harness uses
// SIGKILL for crashes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/bucketq/bucketq/internal/clocktest"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

type options struct {
	mode, addr, ns, ledgerPath, idFile string
	addrs                              string // lanes' servers, comma-separated: sharded
	offset                             time.Duration
	seed                               uint64

	// engine settings
	resolution, timeout, leaseGrace, hbInterval, hbTTL, idleWait time.Duration
	shutdown, backoff, reapInterval, doneRetention               time.Duration
	dispatchBuckets, dispatchTasks, enqueueLanes, prefetch       int
	maxPayload, maxRecoveries, concurrency, maxRunning           int
	keyMaxRunning                                                int
	queueRate, keyRate                                           string
	queues, unknown                                              string
	unknownGrace                                                 time.Duration

	// producer
	count, batchMax, pad int
	rate                 float64
	delayMax             time.Duration
	immediate            float64
	prefix, queue        string
	selfKill             float64
	selfKillMax          time.Duration
	goroutines           int
	keys                 int
	expire               float64
	// census counts the commands of a producer's connections (its G
	// lines: calls against EXECs).
	census *redis24.Census

	// worker
	sleepMax, slowSleep time.Duration
	snooze              float64

	// scheduler
	entry          string
	every, horizon time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "", "producer, dispatcher, worker or reaper")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:6379", "Redis address")
	flag.StringVar(&o.ns, "ns", "chaos", "namespace")
	flag.StringVar(&o.addrs, "addrs", "", "lanes: one Redis address per lane, comma-separated (a sharded engine; -addr unused)")
	flag.StringVar(&o.ledgerPath, "ledger", "", "ledger file (producer, worker)")
	flag.StringVar(&o.idFile, "idfile", "", "file to write the worker id to")
	flag.DurationVar(&o.offset, "offset", 0, "clock offset (clocktest.Offset)")
	flag.Uint64Var(&o.seed, "seed", 1, "random seed")

	flag.DurationVar(&o.resolution, "resolution", 10*time.Millisecond, "Config.Advanced.Resolution")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Second, "Config.DefaultTimeout")
	flag.DurationVar(&o.leaseGrace, "lease-grace", 2*time.Second, "Config.Advanced.LeaseGrace")
	flag.DurationVar(&o.hbInterval, "hb-interval", 200*time.Millisecond, "Config.Advanced.HeartbeatInterval")
	flag.DurationVar(&o.hbTTL, "hb-ttl", time.Second, "Config.Advanced.HeartbeatTTL")
	flag.DurationVar(&o.idleWait, "idle-wait", time.Second, "Config.Advanced.IdleWait")
	flag.DurationVar(&o.shutdown, "shutdown-timeout", 5*time.Second, "Config.ShutdownTimeout")
	flag.DurationVar(&o.backoff, "backoff", 100*time.Millisecond, "retry backoff per attempt (capped at 1s)")
	flag.DurationVar(&o.reapInterval, "reap-interval", 200*time.Millisecond, "Config.Advanced.ReapInterval")
	flag.DurationVar(&o.doneRetention, "done-retention", 0, "Config.DoneRetention (0: default)")
	flag.IntVar(&o.maxPayload, "max-payload", 64<<10, "Config.MaxPayload")
	flag.IntVar(&o.maxRecoveries, "max-recoveries", 0, "Config.Advanced.MaxRecoveries (0: default)")
	flag.IntVar(&o.dispatchBuckets, "dispatch-buckets", 0, "Config.Advanced.DispatchBuckets (0: default)")
	flag.IntVar(&o.dispatchTasks, "dispatch-tasks", 0, "Config.Advanced.DispatchTasks (0: default)")
	flag.IntVar(&o.enqueueLanes, "enqueue-lanes", 0, "Config.Advanced.EnqueueGroupLanes (0: default)")
	flag.IntVar(&o.prefetch, "prefetch", 0, "Config.Advanced.Prefetch (0: default; negative: none)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "Config.Concurrency")
	flag.IntVar(&o.maxRunning, "max-running", 0, "worker: QueueConfig.MaxRunning of every queue (0: none)")
	flag.IntVar(&o.keyMaxRunning, "key-max-running", 0, "worker: QueueConfig.KeyMaxRunning of every queue (0: none)")
	flag.StringVar(&o.queueRate, "queue-rate", "", "worker: QueueConfig.Rate of every queue (N/period; empty: none)")
	flag.StringVar(&o.keyRate, "key-rate", "", "worker: QueueConfig.KeyRate of every queue (N/period; empty: none)")
	flag.IntVar(&o.keys, "keys", 0, "producer: give each task one of this many keys, k0 to half of them (engine.Key; 0: none)")
	flag.Float64Var(&o.expire, "expire", 0, "producer: share of tasks that expire (engine.ExpireIn) up to 1 s after their due time")
	flag.StringVar(&o.queues, "queues", "default", "comma-separated queues the worker takes from")
	flag.StringVar(&o.unknown, "unknown", "retry", "Config.UnknownType: retry or dead")
	flag.DurationVar(&o.unknownGrace, "unknown-grace", time.Second, "Config.Advanced.UnknownTypeGrace (negative: none)")

	flag.IntVar(&o.count, "count", 1000, "producer: tasks to enqueue (acknowledged)")
	flag.Float64Var(&o.rate, "rate", 500, "producer: tasks per second")
	flag.IntVar(&o.batchMax, "batch-max", 20, "producer: largest batch")
	flag.IntVar(&o.pad, "pad", 0, "producer: payload padding in bytes")
	flag.DurationVar(&o.delayMax, "delay-max", 5*time.Second, "producer: longest delay")
	flag.Float64Var(&o.immediate, "immediate", 0.3, "producer: share of tasks due at once")
	flag.StringVar(&o.prefix, "prefix", "p", "producer: batch id prefix (unique per incarnation)")
	flag.StringVar(&o.queue, "queue", "default", "producer: queue")
	flag.Float64Var(&o.selfKill, "self-kill", 0, "producer: chance per batch of killing itself (SIGKILL) during the call")
	flag.DurationVar(&o.selfKillMax, "self-kill-max", 3*time.Millisecond, "producer: latest self-kill after the call starts")
	flag.IntVar(&o.goroutines, "producer-goroutines", 1, "producer: goroutines enqueueing at once on its one client (group commit), sharing the rate")

	flag.DurationVar(&o.sleepMax, "sleep-max", 20*time.Millisecond, "worker: longest noop handler sleep")
	flag.DurationVar(&o.slowSleep, "slow-sleep", 1500*time.Millisecond, "worker: sleep of the slow handler")
	flag.Float64Var(&o.snooze, "snooze", 0, "worker: chance that a noop run snoozes its task (up to twice a task) instead of running it; with it, every run reports its progress")
	flag.StringVar(&o.entry, "entry", "chaos-tick", "scheduler: the periodic entry's name (type noop)")
	flag.DurationVar(&o.every, "every", time.Second, "scheduler: the entry's interval")
	flag.DurationVar(&o.horizon, "horizon", 10*time.Second, "scheduler: Scheduler.Horizon")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With("pid", os.Getpid(), "mode", o.mode)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("chaosproc failed", "err", err)
		os.Exit(3)
	}
	log.Info("chaosproc exiting")
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	var violations atomic.Int64
	if o.mode == "producer" {
		o.census = redis24.NewCensus()
	}
	newPool := func(addr string) *redis.Pool {
		return &redis.Pool{
			MaxIdle:     o.concurrency + 8,
			IdleTimeout: 30 * time.Second,
			Dial: func() (redis.Conn, error) {
				c, err := redis.Dial("tcp", addr,
					redis.DialConnectTimeout(2*time.Second),
					redis.DialReadTimeout(10*time.Second),
					redis.DialWriteTimeout(5*time.Second))
				if err != nil {
					return nil, err
				}
				opts := []redis24.Option{redis24.OnViolation(func(v *redis24.Violation) {
					violations.Add(1)
					log.Error("redis24 violation", "command", v.Command, "args", strings.Join(v.Args, " "), "reason", v.Reason, "caller", v.Caller)
				})}
				if o.census != nil {
					opts = append(opts, redis24.WithCensus(o.census))
				}
				return redis24.Wrap(c, opts...), nil
			},
		}
	}
	pool := newPool(o.addr)
	defer pool.Close()
	var lanes []*redis.Pool
	if o.addrs != "" {
		for _, a := range strings.Split(o.addrs, ",") {
			p := newPool(a)
			defer p.Close()
			lanes = append(lanes, p)
		}
	}

	var queues []engine.QueueConfig
	for _, q := range strings.Split(o.queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			queues = append(queues, engine.QueueConfig{Name: q, Weight: 1, MaxRunning: o.maxRunning,
				Rate: o.queueRate, KeyMaxRunning: o.keyMaxRunning, KeyRate: o.keyRate})
		}
	}
	unknown := "retry"
	if o.unknown == "dead" {
		unknown = "dead"
	}
	backoff := o.backoff
	cfg := engine.Config{Namespace: o.ns, MaxPayload: o.maxPayload, DefaultTimeout: o.timeout, Queues: queues, Concurrency: o.concurrency, ShutdownTimeout: o.shutdown, RetryDelay: func(_ *engine.Task, attempt int, _ error) time.Duration {
		return min(backoff*time.Duration(max(attempt, 1)), time.Second)
	}, UnknownType: unknown, DoneRetention: o.doneRetention, Logger: log, Advanced: engine.AdvancedConfig{Resolution: o.resolution, LeaseGrace: o.leaseGrace, HeartbeatInterval: o.hbInterval, HeartbeatTTL: o.hbTTL, IdleWait: o.idleWait, UnknownTypeGrace: o.unknownGrace, MaxRecoveries: o.maxRecoveries, DispatchBuckets: o.dispatchBuckets, DispatchTasks: o.dispatchTasks, EnqueueGroupLanes: o.enqueueLanes, Prefetch: o.prefetch, ReapInterval: o.reapInterval, Clock: clocktest.Offset(o.offset)}}
	log.Info("chaosproc starting", "addr", o.addr, "ns", o.ns, "offset", o.offset.String())
	var err error
	switch {
	case len(lanes) > 0:
		err = runSharded(ctx, lanes, cfg, o, log)
	case o.mode == "producer":
		err = produce(ctx, pool, cfg, o, log)
	case o.mode == "flow-producer":
		var c *engine.Client
		if c, err = engine.NewClient(cfg, pool); err == nil {
			err = produceFlows(ctx, c, o, log)
		}
	case o.mode == "worker":
		err = work(ctx, pool, cfg, o, log)
	case o.mode == "dispatcher":
		var d enginehook.Dispatcher
		if d, err = enginehook.NewDispatcher(pool, cfg); err == nil {
			err = d.Run(ctx)
			log.Info("dispatcher done", "moved", d.Moved(), "conflicts", d.Conflicts())
		}
	case o.mode == "scheduler":
		err = schedule(ctx, pool, cfg, o, log)
	case o.mode == "reaper":
		var r enginehook.Reaper
		if r, err = enginehook.NewReaper(pool, cfg); err == nil {
			err = r.Run(ctx)
		}
	default:
		err = fmt.Errorf("unknown -mode %q", o.mode)
	}
	if stoppedEarly(ctx, err) {
		log.Info("stopped before it could register", "err", err)
		err = nil
	}
	if n := violations.Load(); n > 0 && err == nil {
		err = fmt.Errorf("%d commands not valid for Redis 2.4", n)
	}
	return err
}

// schedule declares one periodic entry of type noop and keeps its
// firings enqueued until ctx ends.
func schedule(ctx context.Context, pool *redis.Pool, cfg engine.Config, o options, log *slog.Logger) error {
	s, err := enginehook.NewScheduler(pool, cfg, o.horizon, engine.Periodic{Name: o.entry, Every: o.every, Type: "noop", Payload: []byte("tick")})
	if err != nil {
		return err
	}
	log.Info("scheduler id", "scheduler", s.ID())
	return s.Run(ctx)
}

// lockedRand is a seeded source shared by goroutines.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newRand(seed uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) int64n(n int64) int64 {
	if n <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Int64N(n)
}

func (l *lockedRand) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

func produce(ctx context.Context, pool *redis.Pool, cfg engine.Config, o options, log *slog.Logger) error {
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		return err
	}
	return produceWith(ctx, client, o, log)
}

// enqueuer is what a producer writes with: an *engine.Client, or a
// sharded one (shard.go).
type enqueuer interface {
	Enqueue(ctx context.Context, typ string, payload []byte, opts ...engine.Option) (*engine.TaskInfo, error)
	EnqueueBatch(ctx context.Context, tasks []engine.NewTask) ([]*engine.TaskInfo, error)
}

func produceWith(ctx context.Context, client enqueuer, o options, log *slog.Logger) error {
	if o.ledgerPath == "" {
		return errors.New("producer needs -ledger")
	}
	led, err := ledger.Create(o.ledgerPath)
	if err != nil {
		return err
	}
	defer led.Close()
	if err := led.Write(fmt.Sprintf("H %d %d", os.Getpid(), o.offset.Milliseconds())); err != nil {
		return err
	}
	rng := newRand(o.seed)
	clock := clocktest.Offset(o.offset)
	pad := ""
	if o.pad > 0 {
		b := make([]byte, o.pad)
		for i := range b {
			b[i] = byte('a' + rng.int64n(26))
		}
		pad = " " + string(b)
	}
	// The goroutines share the count: each reserves its batch's tasks
	// before it sends them and gives them back when the call fails, so
	// that the producer stops once count tasks are acknowledged.
	var (
		mu                     sync.Mutex
		claimed, acked, failed int
		seq, calls             atomic.Int64
	)
	// groups writes a G line: the calls made and the EXECs sent so far.
	groups := func() error {
		if o.census == nil {
			return nil
		}
		// The census counts names case-insensitively.
		return led.Write(fmt.Sprintf("G %d %d", calls.Load(), o.census.Count("exec")))
	}
	reserve := func(n int) int {
		mu.Lock()
		defer mu.Unlock()
		n = min(n, o.count-claimed)
		claimed += max(n, 0)
		return n
	}
	g := max(o.goroutines, 1)
	rate := o.rate / float64(g)
	loop := func() error {
		next := time.Now()
		for ctx.Err() == nil {
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					continue
				case <-time.After(d):
				}
			} else if d < -time.Second {
				next = time.Now() // do not burst to catch up after an outage
			}
			n := reserve(1 + int(rng.int64n(int64(o.batchMax))))
			if n <= 0 {
				return nil
			}
			next = next.Add(time.Duration(float64(n) / rate * float64(time.Second)))
			bid := fmt.Sprintf("%s.%d", o.prefix, seq.Add(1))
			now := clock.Now()
			opts := []engine.Option{engine.Queue(o.queue)}
			if o.addrs != "" {
				// Sharded: a batch goes to one lane, all or nothing.
				opts = append(opts, engine.ShardKey(bid))
			}
			delayed := make([]bool, n)
			tasks := make([]engine.NewTask, n)
			dues := make([]int64, n)
			for i := range tasks {
				payload := []byte(fmt.Sprintf("batch:%s:%d%s", bid, i, pad))
				tasks[i] = engine.NewTask{Type: "noop", Payload: payload, Options: slices.Clone(opts)}
				dues[i] = now.UnixMilli()
				if rng.float() >= o.immediate {
					due := now.Add(time.Duration(rng.int64n(int64(o.delayMax))))
					tasks[i].Options = append(tasks[i].Options, engine.At(due))
					delayed[i] = true
					dues[i] = due.UnixMilli()
				}
				if o.keys > 0 {
					// Half the tasks have key k0, so that one key's limits
					// bind while the others flow.
					k := int64(0)
					if rng.float() >= 0.5 {
						k = rng.int64n(int64(o.keys))
					}
					tasks[i].Options = append(tasks[i].Options, engine.Key(fmt.Sprintf("k%d", k)))
				}
				if o.expire > 0 && rng.float() < o.expire {
					// Expires up to a second after its due time: some
					// start in time, some wait past it (a slot, a window,
					// a kill) and must be buried, never started.
					d := time.Duration(dues[i]-now.UnixMilli())*time.Millisecond + time.Millisecond + time.Duration(rng.int64n(int64(time.Second)))
					tasks[i].Options = append(tasks[i].Options, engine.ExpireIn(d))
				}
			}
			if err := led.Write(fmt.Sprintf("B %s %d %d", bid, n, now.UnixMilli())); err != nil {
				return err
			}
			if o.selfKill > 0 && rng.float() < o.selfKill {
				// Die by SIGKILL a random moment after the call starts: in
				// the middle of sending the batch, or just after it returned.
				d := time.Duration(rng.int64n(int64(o.selfKillMax) + 1))
				if err := led.Write(fmt.Sprintf("X %s %d", bid, d.Microseconds())); err != nil {
					return err
				}
				time.AfterFunc(d, func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) })
			}
			c := calls.Add(1)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			var (
				ids []string
				err error
			)
			if n == 1 && rng.float() < 0.5 {
				// Exercise the single-task entry point too; the task's
				// options hold its queue, shard key and due time, as the
				// batch's do.
				var info *engine.TaskInfo
				info, err = client.Enqueue(cctx, "noop", tasks[0].Payload, tasks[0].Options...)
				if err == nil {
					ids = []string{info.ID}
				}
			} else {
				var infos []*engine.TaskInfo
				infos, err = client.EnqueueBatch(cctx, tasks)
				for _, info := range infos {
					ids = append(ids, info.ID)
				}
			}
			cancel()
			if err != nil {
				mu.Lock()
				claimed -= n
				failed++
				nf := failed
				mu.Unlock()
				msg := strings.Join(strings.Fields(err.Error()), " ")
				if werr := led.Write(fmt.Sprintf("F %s %s", bid, msg)); werr != nil {
					return werr
				}
				if nf <= 10 || nf%100 == 0 {
					log.Warn("enqueue failed", "batch", bid, "n", n, "err", err, "failures", nf)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(50+rng.int64n(150)) * time.Millisecond):
				}
				continue
			}
			ls := make([]string, n)
			for i, id := range ids {
				ls[i] = fmt.Sprintf("A %s %d %s %d", bid, i, id, dues[i])
			}
			if err := led.Write(ls...); err != nil {
				return err
			}
			if c%20 == 0 {
				if err := groups(); err != nil {
					return err
				}
			}
			if err := led.Sync(); err != nil {
				return err
			}
			mu.Lock()
			acked += n
			mu.Unlock()
		}
		return nil
	}
	errs := make(chan error, g)
	for range g {
		go func() { errs <- loop() }()
	}
	var first error
	for range g {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	if err := groups(); err != nil {
		return err
	}
	log.Info("producer done", "acked", acked, "failed_batches", failed)
	return nil
}

func work(ctx context.Context, pool *redis.Pool, cfg engine.Config, o options, log *slog.Logger) error {
	if o.ledgerPath == "" {
		return errors.New("worker needs -ledger")
	}
	led, err := ledger.Create(o.ledgerPath)
	if err != nil {
		return err
	}
	defer led.Close()
	mux := workMux(led, o, log)
	w, err := enginehook.NewWorker(pool, cfg, mux)
	if err != nil {
		return err
	}
	if err := writeLimits(ctx, pool, cfg, log); err != nil {
		return err
	}
	if err := writeIDs(o.idFile, w.ID()); err != nil {
		return err
	}
	log.Info("worker id", "worker", w.ID())
	err = countChained(led, w.Chained, w.ClaimedAhead, log, func() error { return w.Run(ctx) })
	log.Info("worker done", "processed", w.Processed(), "failed", w.Failed(), "chained", w.Chained(), "ahead", w.ClaimedAhead())
	return err
}

// writeLimits writes the queues' concurrency limits, as a Server does
// when it starts (a worker alone does not), retrying through cut
// connections until ctx ends.
func writeLimits(ctx context.Context, pool *redis.Pool, cfg engine.Config, log *slog.Logger) error {
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		return err
	}
	for _, q := range cfg.Queues {
		if q.MaxRunning <= 0 && q.Rate == "" && q.KeyMaxRunning <= 0 && q.KeyRate == "" {
			continue
		}
		for {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := in.SetQueueLimits(cctx, q)
			cancel()
			if err == nil {
				break
			}
			log.Warn("could not set the queue limit; retrying", "queue", q.Name, "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// countChained runs run, meanwhile writing a C line (ledger.Chained)
// whenever count, the worker's batches taken with results, has grown,
// and a P line (ledger.Ahead) whenever ahead, its tasks claimed ahead of
// a free slot, has, looking every 200 ms, and once more when run returns:
// a worker killed loses at most the last 200 ms of them.
func countChained(led *ledger.Writer, count, ahead func() int64, log *slog.Logger, run func() error) error {
	done := make(chan struct{})
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		writeChained(led, count, ahead, done, log)
	}()
	err := run()
	close(done)
	<-counted
	return err
}

func writeChained(led *ledger.Writer, count, ahead func() int64, done <-chan struct{}, log *slog.Logger) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var last, lastAhead int64
	write := func() {
		if n := count(); n != last {
			last = n
			if err := led.Write(ledger.Chained(n)); err != nil {
				log.Warn("could not write the chained count", "err", err)
			}
		}
		if n := ahead(); n != lastAhead {
			lastAhead = n
			if err := led.Write(ledger.Ahead(n)); err != nil {
				log.Warn("could not write the claimed-ahead count", "err", err)
			}
		}
	}
	for {
		select {
		case <-t.C:
			write()
		case <-done:
			write()
			return
		}
	}
}

// writeIDs writes the worker ids (one per lane) to the id file, one a
// line, atomically.
func writeIDs(path string, ids ...string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(ids, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// workMux is the worker's handlers: noop and slow, each writing its runs
// to the ledger.
func workMux(led *ledger.Writer, o options, log *slog.Logger) *engine.Mux {
	rng := newRand(o.seed)
	pid := os.Getpid()
	handler := func(sleep func() time.Duration) func(context.Context, *engine.Task) error {
		return func(ctx context.Context, t *engine.Task) error {
			if t.Snoozes < 2 && o.snooze > 0 && rng.float() < o.snooze {
				// Not a run the ledger sees: the task must come back
				// and run, with no attempt used.
				return engine.Snooze(time.Duration(rng.int64n(int64(20*time.Millisecond) + 1)))
			}
			if o.snooze > 0 { // the snooze scenario reports progress too
				if err := engine.SetProgress(ctx, 1, "started"); err != nil {
					return err
				}
			}
			start := time.Now().UnixMilli()
			var expires int64
			if !t.Expires.IsZero() {
				expires = t.Expires.UnixMilli()
			}
			if err := led.Write(ledger.Start(ledger.Run{ID: t.ID, Start: start, PID: pid, Payload: ledger.PayloadWord(t.Payload),
				Attempt: t.Attempt, Recoveries: t.Recoveries, Due: t.Due.UnixMilli(), Key: t.Key, Claimed: t.Started.UnixMilli(),
				Expires: expires})); err != nil {
				return err
			}
			tm := time.NewTimer(sleep())
			defer tm.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tm.C:
			}
			return led.Write(ledger.End(t.ID, time.Now().UnixMilli(), pid))
		}
	}
	mux := engine.NewMux()
	mux.HandleFunc("noop", handler(func() time.Duration { return time.Duration(rng.int64n(int64(o.sleepMax) + 1)) }))
	mux.HandleFunc("slow", handler(func() time.Duration { return o.slowSleep }))
	flowHandlers(mux, led, func() time.Duration { return time.Duration(rng.int64n(int64(o.sleepMax) + 1)) }, log)
	return mux
}

// stoppedEarly reports an error that only says the process was stopped
// (SIGTERM) before a component could reach Redis to register, say while
// its server restarted: what Worker.Run documents for that case, not a
// failure. A joined error (one per lane) qualifies when each part does.
func stoppedEarly(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !stoppedEarly(ctx, e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, context.Canceled)
}
