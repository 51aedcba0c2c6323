// Command bench compares Redis task-queue designs: this repository's engine,
// a naive per-task ZSET design, github.com/hibiken/asynq and
// github.com/adjust/rmq/v5.
//
//	cd bench && go run .                       # everything, small sizes
//	go run . -impls naive,asynq -scenarios dispatch -size full -runs 3
//	go run . -redis 127.0.0.1:6379             # an existing server (never flushed)
//	go run . -render results.json -doc ../docs/benchmarks.md   # the page's tables, from the results
//	go run . -scenarios e2e-limit -impls engine -merge results.json   # one scenario measured again, the rest kept
//
// It starts a fresh redis-server on a free loopback port (persistence off)
// unless -redis is given, runs each scenario for each implementation, prints
// one table on stdout and writes results.json; progress goes to stderr.
// See README.md for the scenarios and what each figure means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// allScenarios lists the scenarios in the order they run.
var allScenarios = []string{"enqueue", "dispatch", "e2e", "e2e24", "e2e-limit", "fair", "lateness", "idle", "memory"}

// scenarioCases maps a scenario name to its case builder.
var scenarioCases = map[string]func(Sizes) []*Case{
	"enqueue":   enqueueCases,
	"dispatch":  dispatchCases,
	"e2e":       e2eCases,
	"e2e24":     e2e24Cases,
	"e2e-limit": e2eLimitCases,
	"fair":      fairCases,
	"lateness":  latenessCases,
	"idle":      idleCases,
	"memory":    memoryCases,
}

func main() {
	maybeRunChild()
	os.Exit(run(os.Args[1:]))
}

// options are the parsed command line.
type options struct {
	scenarios []string
	impls     []string
	sizes     Sizes
	sizeName  string
	runs      int
	redisAddr string
	redisBin  string
	out       string
	poll      time.Duration
	// render, doc: render a results.json's tables into docs/benchmarks.md.
	render, doc string
	// merge: the results.json that this run's scenarios are merged into
	// (written to out); "" for none.
	merge string
	// cpuProfile: where to write a CPU profile of the run ("" for none).
	cpuProfile string
	// memProfile: where to write a heap profile of the run ("" for none).
	memProfile string
}

// parseFlags parses args into options.
func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	scen := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated: "+strings.Join(allScenarios, ","))
	impls := fs.String("impls", "engine,engine-1ms,engine-100ms,naive,asynq,rmq", "implementations, comma-separated (table columns in this order)")
	size := fs.String("size", "small", "size preset: small or full")
	runs := fs.Int("runs", 1, "repeat each measurement N times; report the median and the min–max spread")
	redisAddr := fs.String("redis", "", "host:port of an existing Redis server to use instead of starting one (never FLUSHALLed: per-run namespaces, deleted at the end of each measurement)")
	redisBin := fs.String("redis-server", "redis-server", "redis-server binary to start when -redis is not given")
	out := fs.String("out", "results.json", "where to write the JSON results (\"\" for nowhere)")
	poll := fs.Duration("poll", 10*time.Millisecond, "idle poll interval of polling designs (naive poller sleep, asynq forwarder and task-check intervals, rmq poll duration); 0 = each one's own default (naive 10ms, asynq 5s/1s, rmq 100ms)")
	// Overrides of single size fields (0 or "" = preset).
	payload := fs.Int("payload", 0, "payload bytes per task (preset 100)")
	enqueueN := fs.Int("enqueue-n", 0, "tasks per enqueue measurement")
	producers := fs.String("producers", "", "producer counts for enqueue, e.g. 1,8")
	batch := fs.Int("batch", 0, "tasks per batch call")
	backlog := fs.String("backlog", "", "dispatch backlog sizes, e.g. 100000 or 10000,100000")
	dispatchers := fs.String("dispatchers", "", "dispatcher counts for dispatch, e.g. 1,4")
	e2eN := fs.Int("e2e-n", 0, "tasks per e2e measurement")
	e2eProducers := fs.Int("e2e-producers", 0, "producer goroutines in e2e")
	handlers := fs.String("handlers", "", "handler counts for e2e, e.g. 8,64")
	latRate := fs.String("lateness-rate", "", "tasks scheduled per second in lateness, one case each, e.g. 2000,20000")
	latDur := fs.Duration("lateness-duration", 0, "how long lateness schedules tasks")
	latDelay := fs.Duration("lateness-max-delay", 0, "largest random delay in lateness")
	latWorkers := fs.Int("lateness-workers", 0, "handlers in lateness")
	latProducers := fs.Int("lateness-producers", 0, fmt.Sprintf("goroutines scheduling in lateness (default %d)", defaultLatenessProducers))
	idleDur := fs.Duration("idle-duration", 0, "measured window of idle")
	idleWorkers := fs.Int("idle-workers", 0, "workers in idle")
	idlePeriods := fs.Int("idle-periods", -1, "idle measures over at least this many of the design's longest idle period (default 3; 0: just -idle-duration)")
	memN := fs.Int("memory-n", 0, "scheduled tasks in memory")
	fairN := fs.Int("fair-n", 0, "tasks ahead of the small one in fair")
	fairHandlers := fs.Int("fair-handlers", 0, "handlers in fair")
	render := fs.String("render", "", "render the tables of this results.json instead of measuring (see -doc)")
	doc := fs.String("doc", "-", "with -render: the page whose generated part (between its BEGIN GENERATED and END GENERATED lines) the tables replace (\"-\": stdout)")
	merge := fs.String("merge", "", "merge this run into this results.json: the results of the scenarios measured here replace its results of those scenarios, the rest stays; the whole goes to -out (a run with an error merges nothing)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the harness process (every implementation's client side) to this file; pick one scenario and one implementation to see one design's client")
	memProfile := fs.String("memprofile", "", "write a heap profile of the harness process (allocations since start, every implementation's client side) to this file when the run ends; pick one scenario and one implementation")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	o := &options{sizeName: *size, runs: *runs, redisAddr: *redisAddr, redisBin: *redisBin, out: *out, poll: *poll,
		render: *render, doc: *doc, merge: *merge, cpuProfile: *cpuProfile, memProfile: *memProfile}
	if o.render != "" {
		if o.merge != "" {
			return nil, errors.New("-merge measures: not with -render")
		}
		return o, nil
	}
	if o.merge != "" && o.out == "" {
		return nil, errors.New("-merge needs -out, where the merged results go")
	}
	var err error
	if o.sizes, err = sizePreset(*size); err != nil {
		return nil, err
	}
	if o.runs < 1 {
		return nil, errors.New("-runs must be >= 1")
	}
	for _, s := range splitList(*scen) {
		if scenarioCases[s] == nil {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ","))
		}
	}
	// Keep the canonical order whatever the flag's order.
	want := map[string]bool{}
	for _, s := range splitList(*scen) {
		want[s] = true
	}
	for _, s := range allScenarios {
		if want[s] {
			o.scenarios = append(o.scenarios, s)
		}
	}
	for _, i := range splitList(*impls) {
		if _, err := newImpl(i); err != nil {
			return nil, err
		}
		o.impls = append(o.impls, i)
	}
	if len(o.scenarios) == 0 || len(o.impls) == 0 {
		return nil, errors.New("nothing to run: empty -scenarios or -impls")
	}
	s := &o.sizes
	setInt(&s.Payload, *payload)
	setInt(&s.EnqueueN, *enqueueN)
	setInt(&s.Batch, *batch)
	setInt(&s.E2EN, *e2eN)
	setInt(&s.E2EProducers, *e2eProducers)
	setInt(&s.LatenessWorkers, *latWorkers)
	setInt(&s.LatenessProducers, *latProducers)
	setInt(&s.IdleWorkers, *idleWorkers)
	if *idlePeriods >= 0 {
		s.IdlePeriods = *idlePeriods
	}
	setInt(&s.MemoryN, *memN)
	setInt(&s.FairN, *fairN)
	setInt(&s.FairHandlers, *fairHandlers)
	setDur(&s.LatenessDuration, *latDur)
	setDur(&s.LatenessMaxDelay, *latDelay)
	setDur(&s.IdleDuration, *idleDur)
	for _, l := range []struct {
		dst  *[]int
		flag string
		name string
	}{{&s.Producers, *producers, "producers"}, {&s.Backlogs, *backlog, "backlog"},
		{&s.Dispatchers, *dispatchers, "dispatchers"}, {&s.Handlers, *handlers, "handlers"},
		{&s.LatenessRates, *latRate, "lateness-rate"}} {
		if l.flag == "" {
			continue
		}
		if *l.dst, err = parseInts(l.flag); err != nil {
			return nil, fmt.Errorf("-%s: %w", l.name, err)
		}
	}
	return o, nil
}

// run is main without the exit, for tests.
func run(args []string) int {
	if len(args) > 0 && args[0] == "shards" {
		return runShards(args[1:]) // scenario_shard.go
	}
	o, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if o.render != "" {
		if err := renderDoc(o.render, o.doc); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		return 0
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -cpuprofile:", err)
			return 2
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "bench: -cpuprofile:", err)
			}
		}()
	}
	if o.memProfile != "" {
		runtime.MemProfileRate = 4096 // finer than the default, for per-task allocation sites
		defer func() {
			if err := writeHeapProfile(o.memProfile); err != nil {
				fmt.Fprintln(os.Stderr, "bench: -memprofile:", err)
			}
		}()
	}
	rep, err := execute(ctx, o)
	if rep != nil {
		rep.WriteTable(os.Stdout, o.impls)
		fmt.Printf("\nwall time %.1fs\n", rep.WallSecs)
		out := rep
		if o.merge != "" {
			if err != nil || slices.ContainsFunc(rep.Results, func(r *Result) bool { return r.Status == StatusError }) {
				if err != nil {
					fmt.Fprintln(os.Stderr, "bench:", err)
				}
				fmt.Fprintln(os.Stderr, "bench: the run failed: nothing merged into", o.merge)
				return 1
			}
			if out, err = mergeInto(o.merge, rep); err != nil {
				fmt.Fprintln(os.Stderr, "bench: -merge:", err)
				return 1
			}
		}
		if o.out != "" {
			if err := out.WriteJSON(o.out); err != nil {
				fmt.Fprintln(os.Stderr, "bench: writing", o.out+":", err)
				return 1
			}
			fmt.Fprintln(os.Stderr, "wrote", o.out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	for _, r := range rep.Results {
		if r.Status == StatusError {
			return 1
		}
	}
	return 0
}

// execute starts (or connects to) the server, runs the selected cases and
// returns the finished report.
func execute(ctx context.Context, o *options) (*Report, error) {
	addr, own := o.redisAddr, o.redisAddr == ""
	if own {
		fmt.Fprintf(os.Stderr, "starting %s ...\n", o.redisBin)
		srv, err := StartRedis(ctx, o.redisBin)
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		addr = srv.Addr
		fmt.Fprintf(os.Stderr, "redis-server on %s (snapshots off, appendonly no)\n", addr)
	}
	h := NewHarness(addr, own, o.sizes, o.runs, o.impls, o.poll, os.Stderr)
	defer h.Admin.Close()
	if own {
		h.RedisBin = o.redisBin // concurrent idle measurements start their own
	}
	info, err := h.Admin.Info("server")
	if err != nil {
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	h.Report = NewReport(meta(o, addr, own, info))
	h.legacyServer(info)
	if !own {
		h.Report.Note("shared server (-redis): idle and memory figures include whatever other clients do")
	}
	var cases []*Case
	for _, s := range o.scenarios {
		cases = append(cases, scenarioCases[s](o.sizes)...)
	}
	h.RunCases(ctx, cases)
	h.Report.Finish(o.impls)
	if ctx.Err() != nil {
		h.Report.Note("interrupted: results are partial")
		return h.Report, ctx.Err()
	}
	return h.Report, nil
}

// meta describes the run for results.json.
func meta(o *options, addr string, own bool, info map[string]string) map[string]any {
	m := map[string]any{
		"args":          os.Args[1:],
		"size":          o.sizeName,
		"sizes":         o.sizes,
		"runs":          o.runs,
		"scenarios":     o.scenarios,
		"impls":         o.impls,
		"poll":          o.poll.String(),
		"redis_addr":    addr,
		"redis_started": own,
		"redis_version": info["redis_version"],
		"go":            runtime.Version(),
		"goos":          runtime.GOOS,
		"goarch":        runtime.GOARCH,
		"cpus":          runtime.NumCPU(),
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		deps := map[string]string{}
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/hibiken/asynq", "github.com/adjust/rmq/v5", "github.com/gomodule/redigo",
				"github.com/redis/go-redis/v9", "github.com/bucketq/bucketq":
				deps[d.Path] = d.Version
			}
		}
		m["modules"] = deps
	}
	return m
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(strings.ReplaceAll(p, "_", ""))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad count %q", p)
		}
		out = append(out, n)
	}
	return out, nil
}

func setInt(dst *int, v int) {
	if v > 0 {
		*dst = v
	}
}

func setDur(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// writeHeapProfile writes the heap profile (allocations since the process
// started, at runtime.MemProfileRate) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
