package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/redis24"
	"github.com/spf13/cobra"
)

// demoOptions are the demo's knobs.
type demoOptions struct {
	tasks       int
	spread      time.Duration
	concurrency int
	logLevel    string
	seed        uint64
}

func (a *app) newDemoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo [flags]",
		Short: "run a demonstration on an in-memory Redis",
		Long: `Starts an in-memory Redis (miniredis) in this process, schedules tasks due
over the next --spread across three queues (critical:6, default:3, low:1),
runs a dispatcher and workers, shows progress, and ends with a summary:
lateness of first runs (handler start minus due time), retries, dead
letters, and lost tasks. Every task is checked against a ledger: each must
end done (or, for the one meant to fail, dead) exactly once. Exits 1 if
any task was lost, ran early or ran twice, or if any command outside the
Redis 2.4 table was sent.`,
		Args: cobra.NoArgs,
	}
	o := demoOptions{}
	fs := cmd.Flags()
	fs.IntVar(&o.tasks, "tasks", 300, "how many tasks to schedule (at least 1)")
	fs.DurationVar(&o.spread, "spread", 10*time.Second, "spread the due times over this long")
	fs.IntVar(&o.concurrency, "concurrency", 16, "handlers run at once")
	fs.StringVar(&o.logLevel, "log-level", "error", "engine log `level` (retries log at warn)")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed (0: random)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		level, err := parseLevel(o.logLevel)
		switch {
		case o.tasks < 1 || o.tasks > 100000:
			err = fmt.Errorf("--tasks %d: want 1 to 100000", o.tasks)
		case o.spread < 0 || o.spread > 10*time.Minute:
			err = fmt.Errorf("--spread %v: want 0 to 10m", o.spread)
		case o.concurrency < 1:
			err = fmt.Errorf("--concurrency %d: want at least 1", o.concurrency)
		}
		if err != nil {
			return a.usageError(cmd, "%v", err)
		}
		if o.seed == 0 {
			o.seed = rand.Uint64()
		}
		log := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
		d := &demo{opt: o, out: a.stdout, log: log, live: isTerminal(a.stdout), runs: map[string][]demoRun{}}
		if code := d.run(cmd.Context()); code != exitOK {
			return exitCode(code)
		}
		return nil
	}
	return cmd
}

// demoTask is one ledger entry: what was enqueued and how it must end.
type demoTask struct {
	id, typ, queue string
	due            time.Time
	want           engine.State
	maxAttempts    int
}

// demoRun is one handler run as the handler saw it.
type demoRun struct {
	start, due time.Time
	attempt    int
	result     string // ok, fail or later
}

type demo struct {
	opt  demoOptions
	out  io.Writer
	log  *slog.Logger
	live bool // stdout is a terminal: update one line in place

	mu     sync.Mutex
	runs   map[string][]demoRun // by task id
	ledger []*demoTask
}

// The demo's task types: how each behaves and how it must end.
const (
	typeOK     = "ok"     // succeeds
	typeFlaky  = "flaky"  // fails twice, then succeeds
	typeBusy   = "busy"   // asks to run again later once, then succeeds
	typeDoomed = "doomed" // always fails: dead after 3 attempts
)

func (d *demo) handle(_ context.Context, t *engine.Task) error {
	start := time.Now()
	d.mu.Lock()
	prior := d.runs[t.ID]
	r := demoRun{start: start, due: t.Due, attempt: t.Attempt, result: "ok"}
	var err error
	switch t.Type {
	case typeFlaky:
		if t.Attempt < 3 {
			r.result, err = "fail", fmt.Errorf("flaky: attempt %d fails on purpose", t.Attempt)
		}
	case typeBusy:
		if len(prior) == 0 {
			r.result, err = "later", engine.Snooze(250*time.Millisecond)
		}
	case typeDoomed:
		r.result, err = "fail", errors.New("doomed: fails every time")
	}
	d.runs[t.ID] = append(prior, r)
	d.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond) // some work
	return err
}

func (d *demo) run(ctx context.Context) int {
	began := time.Now()
	m, err := miniredis.Run()
	if err != nil {
		fmt.Fprintf(d.out, "demo: start miniredis: %v\n", err)
		return exitFailure
	}
	defer m.Close()
	census := redis24.NewCensus()
	pool, err := newPool(RedisSettings{Addr: m.Addr(), DialTimeout: 5 * time.Second}, 0, census)
	if err != nil {
		fmt.Fprintf(d.out, "demo: %v\n", err)
		return exitFailure
	}
	pool.MaxActive, pool.MaxIdle = 0, 64
	defer pool.Close()

	cfg := engine.Config{Namespace: "demo", Queues: []engine.QueueConfig{
		{Name: "critical", Weight: 6}, {Name: "default", Weight: 3}, {Name: "low", Weight: 1}}, Concurrency: d.opt.concurrency, ShutdownTimeout: 2 * time.Second, DefaultTimeout: 10 * time.Second, RetryDelay: func(_ *engine.Task, n int, _ error) time.Duration { return time.Duration(n) * 300 * time.Millisecond }, Logger: d.log, Advanced: engine.AdvancedConfig{Resolution: 10 * time.Millisecond, IdleWait: time.Second, HeartbeatInterval: 500 * time.Millisecond, HeartbeatTTL: 2 * time.Second, ReapInterval: time.Second, LeaseGrace: 2 * time.Second}}
	mux := engine.NewMux()
	for _, t := range []string{typeOK, typeFlaky, typeBusy, typeDoomed} {
		mux.HandleFunc(t, d.handle)
	}
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		fmt.Fprintf(d.out, "demo: %v\n", err)
		return exitFailure
	}
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		fmt.Fprintf(d.out, "demo: %v\n", err)
		return exitFailure
	}
	srv, err := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	if err != nil {
		fmt.Fprintf(d.out, "demo: %v\n", err)
		return exitFailure
	}
	srvDone := make(chan struct{})
	go func() { defer close(srvDone); _ = srv.Run(context.Background()) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-srvDone
	}()

	fmt.Fprintf(d.out, "demo: miniredis at %s; scheduling %d tasks over %v on critical:6, default:3, low:1 (seed %d)\n"+
		"demo: one task in ten fails twice, one in twenty asks to run later, one (type doomed) always fails:\n"+
		"      its \"sent to the dead letters\" ERROR log is expected\n",
		m.Addr(), d.opt.tasks, d.opt.spread, d.opt.seed)
	if err := d.enqueue(ctx, client); err != nil {
		fmt.Fprintf(d.out, "demo: enqueue: %v\n", err)
		return exitFailure
	}
	deadline := began.Add(d.opt.spread + 30*time.Second)
	interrupted := !d.progress(ctx, began, deadline)
	rep := d.verify(ctx, client, time.Now().Add(5*time.Second))
	rep.outside = len(census.Outside24()) + len(census.Violations())
	rep.commands = census.Commands()
	if st, err := in.Queues(ctx); err == nil {
		for _, q := range st {
			rep.statsProcessed += q.Processed
			rep.statsDead += q.Dead
		}
	}
	rep.elapsed = time.Since(began)
	d.summary(rep)
	if interrupted {
		fmt.Fprintln(d.out, "demo: interrupted")
		return exitFailure
	}
	if !rep.ok() {
		fmt.Fprintln(d.out, "demo: FAILED")
		return exitFailure
	}
	fmt.Fprintln(d.out, "demo: OK")
	return exitOK
}

// enqueue schedules the tasks in batches and fills the ledger.
func (d *demo) enqueue(ctx context.Context, client *engine.Client) error {
	rng := rand.New(rand.NewPCG(d.opt.seed, 1))
	now := time.Now()
	var batch []engine.NewTask
	var pending []*demoTask
	flush := func() error {
		infos, err := client.EnqueueBatch(ctx, batch)
		if err != nil {
			return err
		}
		d.mu.Lock()
		for i, info := range infos {
			pending[i].id = info.ID
			d.ledger = append(d.ledger, pending[i])
		}
		d.mu.Unlock()
		batch, pending = batch[:0], pending[:0]
		return nil
	}
	for i := 0; i < d.opt.tasks; i++ {
		t := &demoTask{typ: typeOK, want: engine.StateDone, maxAttempts: 5}
		switch {
		case i == 0:
			t.typ, t.want, t.maxAttempts = typeDoomed, engine.StateDead, 3
		case i%10 == 1:
			t.typ = typeFlaky
		case i%20 == 2:
			t.typ = typeBusy
		}
		switch q := rng.IntN(10); {
		case q < 2:
			t.queue = "critical"
		case q < 7:
			t.queue = "default"
		default:
			t.queue = "low"
		}
		t.due = now
		if i%10 != 5 && d.opt.spread > 0 { // one in ten is due at once
			t.due = now.Add(time.Duration(rng.Int64N(int64(d.opt.spread))))
		}
		t.due = t.due.Truncate(time.Millisecond)
		batch = append(batch, engine.NewTask{Type: t.typ, Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Options: []engine.Option{engine.Queue(t.queue), engine.At(t.due), engine.MaxAttempts(t.maxAttempts)}})
		pending = append(pending, t)
		if len(batch) == 100 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

// finished reports whether the handler records say t has ended as it must.
func (d *demo) finished(t *demoTask) bool {
	runs := d.runs[t.id]
	if len(runs) == 0 {
		return false
	}
	if t.want == engine.StateDead {
		return len(runs) >= t.maxAttempts
	}
	return runs[len(runs)-1].result == "ok"
}

// progress shows what has run until every task finished (true), the
// deadline passed (true; verify reports the rest) or ctx ended (false).
func (d *demo) progress(ctx context.Context, began, deadline time.Time) bool {
	every := time.Second
	if d.live {
		every = 200 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		d.mu.Lock()
		done, retries, dead := 0, 0, 0
		for _, t := range d.ledger {
			if d.finished(t) {
				done++
				if t.want == engine.StateDead {
					dead++
				}
			}
			for _, r := range d.runs[t.id] {
				if r.result != "ok" {
					retries++
				}
			}
		}
		total := len(d.ledger)
		d.mu.Unlock()
		line := fmt.Sprintf("%6.1fs  finished %d/%d  retries %d  dead %d", time.Since(began).Seconds(), done, total, retries, dead)
		if d.live {
			fmt.Fprintf(d.out, "\r\x1b[K%s", line)
		} else {
			fmt.Fprintln(d.out, line)
		}
		if done == total || time.Now().After(deadline) {
			if d.live {
				fmt.Fprintln(d.out)
			}
			return true
		}
		select {
		case <-ctx.Done():
			if d.live {
				fmt.Fprintln(d.out)
			}
			return false
		case <-tick.C:
		}
	}
}

// demoReport is what verify found.
type demoReport struct {
	enqueued, runs, done, dead, retries, failures, later int
	lost, early, duplicates, unexpected                  []string
	lateness                                             []time.Duration
	outside                                              int
	commands                                             []string
	statsProcessed, statsDead                            int64
	wantDone, wantDead                                   int
	elapsed                                              time.Duration
}

func (r *demoReport) ok() bool {
	return len(r.lost)+len(r.early)+len(r.duplicates)+len(r.unexpected)+r.outside == 0 &&
		r.done == r.wantDone && r.dead == r.wantDead
}

// verify checks every ledger entry against Redis (Lookup, until deadline
// for results still being recorded) and against the handler records.
func (d *demo) verify(ctx context.Context, client *engine.Client, deadline time.Time) *demoReport {
	d.mu.Lock()
	ledger := append([]*demoTask(nil), d.ledger...)
	d.mu.Unlock()
	rep := &demoReport{enqueued: len(ledger)}
	state := map[string]engine.State{}
	for pending := ledger; len(pending) > 0; {
		var again []*demoTask
		for _, t := range pending {
			ti, err := client.Lookup(ctx, t.id)
			switch {
			case err == nil && ti.State == t.want:
				state[t.id] = ti.State
			case err == nil:
				state[t.id] = ti.State
				again = append(again, t)
			default:
				state[t.id] = engine.State("missing: " + err.Error())
				again = append(again, t)
			}
		}
		pending = again
		if len(pending) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			for _, t := range pending {
				rep.lost = append(rep.lost, fmt.Sprintf("%s (%s) is %s, want %s", t.id, t.typ, state[t.id], t.want))
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range ledger {
		if t.want == engine.StateDone {
			rep.wantDone++
		} else {
			rep.wantDead++
		}
		switch state[t.id] {
		case engine.StateDone:
			rep.done++
		case engine.StateDead:
			rep.dead++
		}
		runs := d.runs[t.id]
		rep.runs += len(runs)
		oks, fails := 0, 0
		for i, r := range runs {
			if r.start.Before(r.due) || (i == 0 && r.start.Before(t.due)) {
				rep.early = append(rep.early, fmt.Sprintf("%s run %d started %v before its due time", t.id, i+1, r.due.Sub(r.start)))
			}
			switch r.result {
			case "ok":
				oks++
			case "fail":
				fails++
			default:
				rep.later++
			}
		}
		rep.failures += fails
		rep.retries += len(runs) - oks
		if len(runs) > 0 {
			rep.lateness = append(rep.lateness, runs[0].start.Sub(t.due))
		}
		want := map[string][2]int{typeOK: {1, 0}, typeBusy: {1, 0}, typeFlaky: {1, 2}, typeDoomed: {0, t.maxAttempts}}[t.typ]
		if oks > 1 {
			rep.duplicates = append(rep.duplicates, fmt.Sprintf("%s (%s) succeeded %d times", t.id, t.typ, oks))
		} else if len(runs) > 0 && (oks != want[0] || fails != want[1]) {
			rep.unexpected = append(rep.unexpected, fmt.Sprintf("%s (%s): %d successes and %d failures, want %d and %d", t.id, t.typ, oks, fails, want[0], want[1]))
		}
	}
	return rep
}

func (d *demo) summary(r *demoReport) {
	sort.Slice(r.lateness, func(i, j int) bool { return r.lateness[i] < r.lateness[j] })
	pct := func(p float64) time.Duration {
		if len(r.lateness) == 0 {
			return 0
		}
		return r.lateness[int(p*float64(len(r.lateness)-1))].Round(100 * time.Microsecond)
	}
	w := d.out
	fmt.Fprintf(w, "\nsummary after %v\n", r.elapsed.Round(100*time.Millisecond))
	fmt.Fprintf(w, "  tasks enqueued       %d (%d to succeed, %d to die)\n", r.enqueued, r.wantDone, r.wantDead)
	fmt.Fprintf(w, "  handler runs         %d\n", r.runs)
	fmt.Fprintf(w, "  done                 %d (stats: processed %d)\n", r.done, r.statsProcessed)
	fmt.Fprintf(w, "  retries              %d (%d failures, %d asked to run later)\n", r.retries, r.failures, r.later)
	fmt.Fprintf(w, "  dead                 %d (stats: %d)\n", r.dead, r.statsDead)
	fmt.Fprintf(w, "  on-time lateness     p50 %v  p99 %v  max %v  (first runs: handler start minus due time)\n",
		pct(0.5), pct(0.99), pct(1))
	fmt.Fprintf(w, "  ran early            %d\n", len(r.early))
	fmt.Fprintf(w, "  ran twice            %d\n", len(r.duplicates))
	fmt.Fprintf(w, "  unexpected outcomes  %d\n", len(r.unexpected))
	fmt.Fprintf(w, "  lost                 %d\n", len(r.lost))
	fmt.Fprintf(w, "  commands outside Redis 2.4: %d (sent: %s)\n", r.outside, strings.Join(r.commands, " "))
	for _, list := range [][]string{r.lost, r.early, r.duplicates, r.unexpected} {
		for i, s := range list {
			if i == 10 {
				fmt.Fprintf(w, "    ... and %d more\n", len(list)-10)
				break
			}
			fmt.Fprintf(w, "    %s\n", s)
		}
	}
}
