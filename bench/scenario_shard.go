package main

// The shard scenarios: the engine's e2e and dispatch scenarios over 1, 2
// and 4 lanes, each lane on a redis-server of its own, all on this
// machine. They report throughput and each server's CPU (INFO cpu, user +
// sys, over the measured window).
//
//	go run . shards                       # 1,2,4 servers, small sizes
//	go run . shards -servers 1,2,4 -e2e-n 100000 -backlog 200000 -runs 3
//
// e2e: producers enqueue due tasks while a sharded server (every role)
// runs them with a no-op handler; dispatch-burst and dispatch-spread: a
// backlog due at one moment, or spread over an hour, is moved to the
// ready lists by one dispatcher per lane.
//
// On one machine the servers, the producers, the workers and the
// dispatchers share the same cores: the figures show how the work spreads
// over the servers (each server's CPU share) and what the client side
// costs, not what separate machines would reach. docs/scaling.md reads
// them.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/bucketq/bucketq/internal/measured"
	"github.com/gomodule/redigo/redis"
)

// shardOptions are the flags of `bench shards`.
type shardOptions struct {
	servers     []int
	e2eN        int
	producers   int
	concurrency int
	backlog     int
	runs        int
	redisBin    string
}

// shardResult is one measurement.
type shardResult struct {
	scenario  string
	servers   int
	tasks     int
	secs      float64
	serverCPU []float64 // CPU seconds of each server over the window
}

func (r shardResult) rate() float64 { return float64(r.tasks) / r.secs }

func runShards(args []string) int {
	fs := flag.NewFlagSet("bench shards", flag.ContinueOnError)
	servers := fs.String("servers", "1,2,4", "server counts (one lane per server), comma-separated")
	o := shardOptions{}
	fs.IntVar(&o.e2eN, "e2e-n", 20000, "tasks per e2e measurement")
	fs.IntVar(&o.producers, "producers", 8, "producer goroutines in e2e (batches of 50)")
	fs.IntVar(&o.concurrency, "concurrency", 64, "handlers per lane in e2e")
	fs.IntVar(&o.backlog, "backlog", 100000, "due tasks moved in dispatch")
	fs.IntVar(&o.runs, "runs", 1, "repeat each measurement N times; report the median")
	fs.StringVar(&o.redisBin, "redis-server", "redis-server", "redis-server binary")
	doc := fs.String("doc", "", "also write the table into the generated block of this Markdown page (docs/scaling.md)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	for _, s := range splitList(*servers) {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n < 1 || n > 16 {
			fmt.Fprintf(os.Stderr, "bench shards: -servers %q: want counts from 1 to 16\n", *servers)
			return 2
		}
		o.servers = append(o.servers, n)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	started := time.Now().UTC()
	loadBefore := loadAverage()
	var results []shardResult
	for _, n := range o.servers {
		for _, sc := range []string{"e2e", "dispatch-burst", "dispatch-spread"} {
			var runs []shardResult
			for r := 0; r < o.runs; r++ {
				fmt.Fprintf(os.Stderr, "shards: %s on %d servers, run %d\n", sc, n, r+1)
				res, err := shardMeasure(ctx, o, sc, n)
				if err != nil {
					fmt.Fprintln(os.Stderr, "bench shards:", err)
					return 1
				}
				runs = append(runs, res)
			}
			sort.Slice(runs, func(i, j int) bool { return runs[i].rate() < runs[j].rate() })
			results = append(results, runs[len(runs)/2])
		}
	}
	printShardResults(os.Stdout, results)
	if *doc != "" {
		var b strings.Builder
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "doc" {
				set = append(set, "-"+f.Name+" "+f.Value.String())
			}
		})
		fmt.Fprintf(&b, "<!-- do not edit: written by `cd bench && go run . shards %s -doc PAGE` -->\n\n", strings.Join(set, " "))
		fmt.Fprintf(&b, "Run started %s, %.0f s of wall time, %d run(s) per row (median), load average %s before and %s after.\n\n```\n",
			started.Format("2006-01-02 15:04 MST"), time.Since(started).Seconds(), o.runs, loadBefore, loadAverage())
		printShardResults(&b, results)
		b.WriteString("```\n\n")
		if err := writeBlock(*doc, "bench:shards", b.String()); err != nil {
			fmt.Fprintln(os.Stderr, "bench shards:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "wrote the bench:shards block of %s\n", *doc)
	}
	return 0
}

// loadAverage is the one-minute load average ("?" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// writeBlock replaces the generated block name of the page at path with
// body (measured.ReplaceBlock).
func writeBlock(path, name, body string) error {
	page, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, ok := measured.ReplaceBlock(page, name, body)
	if !ok {
		return fmt.Errorf("%s: no <!-- BEGIN GENERATED %s --> ... <!-- END GENERATED %s --> block", path, name, name)
	}
	return os.WriteFile(path, out, 0o644)
}

func printShardResults(w io.Writer, rs []shardResult) {
	fmt.Fprintf(w, "shards: %d CPUs (GOMAXPROCS %d); one lane per server; servers, producers, workers and dispatchers share them\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tservers\ttasks\tseconds\ttasks/s\tRedis CPU per server (% of one core)\tRedis CPU total (core-s per 10k tasks)\t")
	for _, r := range rs {
		var per []string
		total := 0.0
		for _, c := range r.serverCPU {
			per = append(per, fmt.Sprintf("%.0f%%", 100*c/r.secs))
			total += c
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t%s\t%.2f\t\n", r.scenario, r.servers, r.tasks, r.secs, r.rate(),
			strings.Join(per, " "), total/float64(r.tasks)*10000)
	}
	tw.Flush()
}

// shardEnv is n fresh servers and the lanes over them.
type shardEnv struct {
	servers []*RedisServer
	admins  []*Admin
	pools   []*redis.Pool
	cfg     engine.Config
}

func newShardEnv(ctx context.Context, o shardOptions, n int) (*shardEnv, error) {
	e := &shardEnv{cfg: engine.Config{Namespace: "bqshard", Concurrency: o.concurrency,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Advanced: engine.AdvancedConfig{IdleWait: time.Second}}}
	for range n {
		s, err := StartRedis(ctx, o.redisBin)
		if err != nil {
			e.close()
			return nil, err
		}
		e.servers = append(e.servers, s)
		e.admins = append(e.admins, NewAdmin(s.Addr))
		addr := s.Addr
		p := &redis.Pool{MaxIdle: o.concurrency + 16, IdleTimeout: time.Minute,
			Dial: func() (redis.Conn, error) {
				return redis.Dial("tcp", addr, redis.DialConnectTimeout(5*time.Second),
					redis.DialReadTimeout(30*time.Second), redis.DialWriteTimeout(10*time.Second))
			}}
		e.pools = append(e.pools, p)
	}
	return e, nil
}

func (e *shardEnv) close() {
	for _, p := range e.pools {
		p.Close()
	}
	for _, a := range e.admins {
		a.Close()
	}
	for _, s := range e.servers {
		s.Stop()
	}
}

func (e *shardEnv) cpu() ([]float64, error) {
	out := make([]float64, len(e.admins))
	for i, a := range e.admins {
		c, err := a.ServerCPU()
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

func shardMeasure(ctx context.Context, o shardOptions, sc string, n int) (shardResult, error) {
	e, err := newShardEnv(ctx, o, n)
	if err != nil {
		return shardResult{}, err
	}
	defer e.close()
	client, err := engine.NewClient(e.cfg, e.pools...)
	if err != nil {
		return shardResult{}, err
	}
	res := shardResult{scenario: sc, servers: n}
	var before []float64
	var start time.Time
	switch sc {
	case "e2e":
		var done atomic.Int64
		all := make(chan struct{})
		mux := engine.NewMux()
		mux.HandleFunc("noop", func(context.Context, *engine.Task) error {
			if done.Add(1) == int64(o.e2eN) {
				close(all)
			}
			return nil
		})
		srv, err := engine.NewServer(e.cfg, mux, engine.AllRoles, e.pools...)
		if err != nil {
			return res, err
		}
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = srv.Run(sctx) }()
		time.Sleep(500 * time.Millisecond) // the workers register
		if before, err = e.cpu(); err != nil {
			return res, err
		}
		start = time.Now()
		if err := shardProduce(ctx, client, o.e2eN, o.producers, nil); err != nil {
			return res, err
		}
		select {
		case <-all:
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(10 * time.Minute):
			return res, fmt.Errorf("e2e on %d servers: %d of %d tasks ran in 10 minutes", n, done.Load(), o.e2eN)
		}
		res.tasks = o.e2eN
	case "dispatch-burst", "dispatch-spread":
		// A backlog due within the next hour is seeded (burst: all due at
		// once, one bucket per lane; spread: evenly over the hour, many
		// buckets), then dispatchers (one per lane) whose clock runs an
		// hour ahead move it; the window ends when every task is ready.
		base := time.Now().Add(time.Hour)
		dueOf := func(i int) []engine.Option { return []engine.Option{engine.At(base)} }
		if sc == "dispatch-spread" {
			base = time.Now()
			step := time.Hour / time.Duration(o.backlog)
			dueOf = func(i int) []engine.Option { return []engine.Option{engine.At(base.Add(time.Duration(i) * step))} }
		}
		if err := shardProduce(ctx, client, o.backlog, o.producers, dueOf); err != nil {
			return res, err
		}
		dcfg := e.cfg
		dcfg.Advanced.Clock = clocktest.Offset(time.Hour + time.Second)
		srv, err := engine.NewServer(dcfg, nil, engine.RoleDispatcher, e.pools...)
		if err != nil {
			return res, err
		}
		if before, err = e.cpu(); err != nil {
			return res, err
		}
		start = time.Now()
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = srv.Run(sctx) }()
		in, err := engine.NewInspector(e.cfg, e.pools...)
		if err != nil {
			return res, err
		}
		for {
			st, err := in.Queues(ctx)
			if err != nil {
				return res, err
			}
			ready := int64(0)
			for _, q := range st {
				ready += q.Ready
			}
			if ready >= int64(o.backlog) {
				break
			}
			if time.Since(start) > 10*time.Minute {
				return res, fmt.Errorf("dispatch on %d servers: %d of %d ready after 10 minutes", n, ready, o.backlog)
			}
			time.Sleep(5 * time.Millisecond)
		}
		res.tasks = o.backlog
	}
	res.secs = time.Since(start).Seconds()
	after, err := e.cpu()
	if err != nil {
		return res, err
	}
	for i := range after {
		res.serverCPU = append(res.serverCPU, after[i]-before[i])
	}
	return res, nil
}

// shardProduce enqueues total tasks of type noop with p goroutines in
// batches of 50; opts, if not nil, gives task i's options.
func shardProduce(ctx context.Context, c *engine.Client, total, p int, opts func(i int) []engine.Option) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, p)
	for i := range p {
		wg.Go(func() {
			for {
				from := next.Add(50) - 50
				if from >= int64(total) {
					return
				}
				k := min(50, total-int(from))
				batch := make([]engine.NewTask, k)
				for j := range batch {
					batch[j] = engine.NewTask{Type: "noop", Payload: make([]byte, 100)}
					if opts != nil {
						batch[j].Options = opts(int(from) + j)
					}
				}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := c.EnqueueBatch(cctx, batch)
				cancel()
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
