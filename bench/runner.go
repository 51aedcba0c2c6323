package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sizes holds every scenario parameter; presets come from sizePreset and
// flags override single fields.
type Sizes struct {
	Payload          int           // payload bytes of every task
	EnqueueN         int           // tasks per enqueue measurement
	Producers        []int         // producer goroutines, enqueue scenario
	Batch            int           // tasks per batch call
	Backlogs         []int         // dispatch backlog sizes
	Dispatchers      []int         // dispatcher counts, dispatch scenario
	E2EN             int           // tasks per e2e measurement
	E2EProducers     int           // producer goroutines, e2e scenario
	Handlers         []int         // concurrent handlers, e2e scenario
	LatenessRates    []int         // tasks scheduled per second, one case each
	LatenessDuration time.Duration // how long tasks are scheduled
	LatenessMaxDelay time.Duration // delays are uniform in [0, max]
	LatenessWorkers  int           // handlers, lateness scenario (1 dispatcher)
	// LatenessProducers is how many goroutines schedule the lateness
	// scenario's tasks, each one Schedule call at a time.
	LatenessProducers int
	IdleDuration      time.Duration // measured idle window
	IdleWorkers       int           // handlers, idle scenario (1 dispatcher)
	IdlePeriods       int           // idle window: at least this many of the design's longest idle period
	MemoryN           int           // scheduled tasks, memory scenario
	FairN             int           // tasks ahead of the small one, fair scenario
	FairHandlers      int           // handlers, fair scenario
}

// sizePreset returns the "small" or "full" sizes.
func sizePreset(name string) (Sizes, error) {
	s := Sizes{
		Payload:           100,
		EnqueueN:          20000,
		Producers:         []int{1, 8},
		Batch:             100,
		Backlogs:          []int{10000, 100000},
		Dispatchers:       []int{1, 4},
		E2EN:              20000,
		E2EProducers:      8,
		Handlers:          []int{8, 64},
		LatenessRates:     []int{2000, 20000},
		LatenessDuration:  10 * time.Second,
		LatenessMaxDelay:  5 * time.Second,
		LatenessWorkers:   16,
		LatenessProducers: defaultLatenessProducers,
		IdleDuration:      10 * time.Second,
		IdleWorkers:       16,
		IdlePeriods:       3,
		MemoryN:           100000,
		FairN:             100000,
		FairHandlers:      8,
	}
	switch name {
	case "small":
	case "full":
		s.EnqueueN = 200000
		s.Backlogs = []int{100000, 1000000}
		s.E2EN = 200000
		s.LatenessDuration = 60 * time.Second
		s.IdleDuration = 30 * time.Second
		s.MemoryN = 1000000
	default:
		return s, fmt.Errorf("unknown -size %q (small or full)", name)
	}
	return s, nil
}

// MetricDef describes one figure a case produces (one table row).
type MetricDef struct {
	Key  string // key in the map a Run returns
	Unit string // "tasks/s", "ms", "%", "cmds/s", "B/task", "tasks"
}

// Case is one parameter set of one scenario; every implementation it
// applies to is measured with it, -runs times.
type Case struct {
	Scenario string
	Title    string         // parameters, human-readable (table)
	Params   map[string]any // parameters, machine-readable (JSON)
	Metrics  []MetricDef
	// NoOpen: the harness does not Open the implementation in this process
	// (the idle scenario runs it in a child process).
	NoOpen bool
	// Concurrent: the measurements of every implementation and run may
	// go on at once, each on a redis-server of its own, when the harness
	// starts its servers (not with -redis: a shared server's counters
	// would mix them) or the case names its own (RedisBin). For cases
	// that mostly wait (idle).
	Concurrent bool
	// RedisBin: every measurement of the case starts a redis-server of
	// its own from this binary (StartRedis) and runs on it, not on the
	// harness's server, whether or not -redis names one: for a case
	// measured on another Redis version than the rest of the run. The
	// server is the measurement's own (flushed, short namespace). "": the
	// harness's server, or for concurrent measurements (Concurrent) a
	// server each from Harness.RedisBin.
	RedisBin string
	// Needs returns why the case does not apply to impl ("" if it does);
	// it is given an unopened instance, for type assertions.
	Needs func(impl Impl) string
	// Run performs one measurement on an opened implementation.
	Run func(ctx context.Context, m *Measure) (map[string]float64, error)
	// Timeout bounds one measurement (default 10 minutes).
	Timeout time.Duration
}

// Measure is what a Case's Run gets for one measurement.
type Measure struct {
	H    *Harness
	Impl Impl
	Env  Env
	// Admin talks to the measurement's server (Env.Addr): H.Admin, or
	// that of the server the measurement started for itself.
	Admin *Admin
	// Own: the measurement's server is the harness's own (FLUSHALLed
	// before it), not a shared one (-redis).
	Own bool
	run int // the run's number, for progress lines
	mu  sync.Mutex
	det map[string]any
}

// Detail records extra information for results.json.
func (m *Measure) Detail(key string, v any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.det == nil {
		m.det = map[string]any{}
	}
	m.det[key] = v
}

// Progress prints a progress line on stderr.
func (m *Measure) Progress(format string, args ...any) {
	name := m.Impl.Name()
	if m.run > 0 {
		name = fmt.Sprintf("%s run %d", name, m.run)
	}
	m.H.logf("      %s: %s", name, fmt.Sprintf(format, args...))
}

// Harness runs cases against implementations and collects results.
type Harness struct {
	Addr   string
	Own    bool // the harness started the server: FLUSHALL is allowed
	Admin  *Admin
	Sizes  Sizes
	Runs   int
	Impls  []string
	Poll   time.Duration
	Log    io.Writer
	Report *Report
	// RedisBin is the redis-server binary concurrent measurements start
	// a server each with ("": they run one after another on Addr).
	RedisBin string

	runID   string
	seq     atomic.Int64
	logMu   sync.Mutex
	skipped map[string]string // impl → why it is skipped everywhere
}

// NewHarness returns a harness; Report must be set by the caller.
func NewHarness(addr string, own bool, sizes Sizes, runs int, impls []string, poll time.Duration, log io.Writer) *Harness {
	return &Harness{
		Addr: addr, Own: own, Admin: NewAdmin(addr), Sizes: sizes, Runs: max(runs, 1), Impls: impls,
		Poll: poll, Log: log,
		runID:   strconv.FormatInt(time.Now().UnixNano()%1e9, 36),
		skipped: map[string]string{},
	}
}

// legacyServer marks the implementations that cannot run on a server
// older than Redis 2.6 (info is its INFO) as skipped, with a note: asynq
// needs Lua scripts (Redis >= 4); rmq v5 is measured only on servers that
// asynq also runs on, so that its figures are never from another server
// than its peers'. The engine and the naive design run there.
func (h *Harness) legacyServer(info map[string]string) {
	if !h.Admin.Legacy() && !olderThan26(info["redis_version"]) {
		return
	}
	why := map[string]string{
		"asynq": "needs Redis >= 4 (Lua scripts); the server is " + info["redis_version"],
		"rmq":   "not run on a server older than Redis 2.6 (" + info["redis_version"] + "): only the engine and the naive design are measured there",
	}
	for _, name := range h.Impls {
		if w, ok := why[name]; ok {
			h.skipped[name] = w
			h.Report.Note(name + " skipped: " + w)
		}
	}
	h.Report.Note("Redis " + info["redis_version"] + ": no INFO commandstats, so idle counts commands with MONITOR only (client_commands); memory uses INFO used_memory deltas")
}

// olderThan26 reports whether version v ("2.4.18") is older than 2.6.
func olderThan26(v string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 2 || (major == 2 && minor < 6)
}

// logf prints one line on the progress stream.
func (h *Harness) logf(format string, args ...any) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	fmt.Fprintf(h.Log, format+"\n", args...)
}

// namespace returns a fresh namespace for one measurement, on the
// harness's own server when own. On a shared server it names the run as
// well (bqb-<run>-<n>), so that no run meets another's keys. On the
// harness's own server, flushed before each measurement, it is as short
// as the engine's default namespace "bq" (b and the measurement's number
// in base 36: two or three characters), so that the memory figures are
// those of a default deployment's key names: the long form made each key
// name 11 bytes longer, and a record key one allocator class larger.
func (h *Harness) namespace(own bool) string {
	n := h.seq.Add(1)
	if own {
		return "b" + strconv.FormatInt(n, 36)
	}
	return fmt.Sprintf("bqb-%s-%d", h.runID, n)
}

// RunCases runs every case and fills h.Report.
func (h *Harness) RunCases(ctx context.Context, cases []*Case) {
	for i, c := range cases {
		if ctx.Err() != nil {
			return
		}
		h.logf("[%d/%d] %s: %s", i+1, len(cases), c.Scenario, c.Title)
		h.runCase(ctx, c)
	}
}

// runCase measures one case for every implementation, interleaving the
// runs (run 1 of each impl, then run 2 of each, ...) to spread drift.
func (h *Harness) runCase(ctx context.Context, c *Case) {
	type slot struct {
		name   string
		values map[string][]float64
		status string
		note   string
		detail map[string]any
	}
	var slots []*slot
	var active []*slot
	for _, name := range h.Impls {
		s := &slot{name: name, values: map[string][]float64{}, status: StatusOK}
		slots = append(slots, s)
		inst, err := newImpl(name)
		switch {
		case err != nil:
			s.status, s.note = StatusError, err.Error()
		case h.skipped[name] != "":
			s.status, s.note = StatusSkipped, h.skipped[name]
		default:
			if why := c.Needs(inst); why != "" {
				s.status, s.note = StatusNA, why
			} else {
				active = append(active, s)
			}
		}
	}
	if len(active) == 0 {
		var why []string
		for _, s := range slots {
			why = append(why, s.name+": "+s.note)
		}
		h.logf("  nothing to measure (%s)", strings.Join(why, "; "))
	}
	// record takes the outcome of one measurement; false: the slot takes
	// no further runs.
	record := func(s *slot, run int, vals map[string]float64, det map[string]any, err error, secs float64) bool {
		switch {
		case isSkip(err):
			h.skipped[s.name] = err.Error()
			h.Report.Note(fmt.Sprintf("%s skipped: %v", s.name, err))
			h.logf("  %s: skipped: %v", s.name, err)
			s.status, s.note = StatusSkipped, err.Error()
			return false
		case err != nil:
			h.logf("  %s run %d/%d: ERROR %v (%.1fs)", s.name, run, h.Runs, err, secs)
			s.status, s.note = StatusError, err.Error()
			h.Report.Note(fmt.Sprintf("%s %s (%s) %s: %v", c.Scenario, c.Title, s.name, "error", err))
			return false
		}
		// A metric the measurement did not report (the design cannot
		// measure it) stays out of the values: its cell says n/a.
		for _, md := range c.Metrics {
			if v, ok := vals[md.Key]; ok {
				s.values[md.Key] = append(s.values[md.Key], v)
			}
		}
		s.detail = det
		var parts []string
		for _, md := range c.Metrics {
			if v, ok := vals[md.Key]; ok {
				parts = append(parts, fmt.Sprintf("%s=%s", md.Key, formatValue(v, md.Unit)))
			}
		}
		h.logf("  %s run %d/%d: %s (%.1fs)", s.name, run, h.Runs, strings.Join(parts, " "), secs)
		return true
	}
	// bin: the redis-server binary each measurement starts a server of
	// its own from ("": the harness's server).
	bin := c.RedisBin
	if bin == "" && c.Concurrent && h.Own {
		bin = h.RedisBin
	}
	if c.Concurrent && bin != "" && len(active)*h.Runs > 1 {
		// Every implementation and run at once, each on its own server;
		// the outcomes are then taken in the order of the sequential
		// loop below (run 1 of each impl, then run 2, ...).
		type job struct {
			s    *slot
			run  int
			vals map[string]float64
			det  map[string]any
			err  error
			secs float64
		}
		var jobs []*job
		for run := 1; run <= h.Runs; run++ {
			for _, s := range active {
				jobs = append(jobs, &job{s: s, run: run})
			}
		}
		h.logf("  %d measurements at once, each with its own redis-server", len(jobs))
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Go(func() {
				start := time.Now()
				j.vals, j.det, j.err = h.measureOnNew(ctx, c, j.s.name, j.run, bin)
				j.secs = time.Since(start).Seconds()
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		done := map[*slot]bool{}
		for _, j := range jobs {
			if !done[j.s] && !record(j.s, j.run, j.vals, j.det, j.err, j.secs) {
				done[j.s] = true
			}
		}
		active = nil
	}
	for run := 1; run <= h.Runs && len(active) > 0; run++ {
		var still []*slot
		for _, s := range active {
			if ctx.Err() != nil {
				return
			}
			start := time.Now()
			var vals map[string]float64
			var det map[string]any
			var err error
			if c.RedisBin != "" {
				vals, det, err = h.measureOnNew(ctx, c, s.name, 0, c.RedisBin)
			} else {
				vals, det, err = h.measure(ctx, c, s.name)
			}
			if record(s, run, vals, det, err, time.Since(start).Seconds()) {
				still = append(still, s)
			}
		}
		active = still
	}
	for _, s := range slots {
		for _, md := range c.Metrics {
			r := &Result{
				Scenario: c.Scenario, Case: c.Title, Params: c.Params, Impl: s.name,
				Metric: md.Key, Unit: md.Unit, Status: s.status, Note: s.note,
			}
			if s.status == StatusOK && len(s.values[md.Key]) == 0 {
				r.Status, r.Note = StatusNA, "not measured for this design"
				if isCPUMetric(md.Key) {
					r.Note = cpuNA
				}
			} else if s.status == StatusOK {
				r.setValues(s.values[md.Key])
				r.Detail = s.detail
			}
			h.Report.Add(r)
		}
	}
}

// measure performs one measurement of c on a fresh instance of impl in a
// fresh namespace (after FLUSHALL on the harness's own server), then cleans
// up (on a shared server: Cleanup and deletion of its KeyPatterns).
func (h *Harness) measure(ctx context.Context, c *Case, name string) (map[string]float64, map[string]any, error) {
	return h.measureOn(ctx, c, name, 0, h.Addr, h.Admin, h.Own)
}

// measureOnNew is measure on a redis-server of the measurement's own,
// started from bin (StartRedis) and stopped after it; run numbers the
// progress lines of concurrent measurements (0: none).
func (h *Harness) measureOnNew(ctx context.Context, c *Case, name string, run int, bin string) (map[string]float64, map[string]any, error) {
	srv, err := StartRedis(ctx, bin)
	if err != nil {
		return nil, nil, fmt.Errorf("starting a redis-server for the measurement: %w", err)
	}
	defer srv.Stop()
	admin := NewAdmin(srv.Addr)
	defer admin.Close()
	return h.measureOn(ctx, c, name, run, srv.Addr, admin, true)
}

// measureOn is measure on the server at addr (admin talks to it; own:
// the harness's own, flushed before the measurement); run numbers the
// progress lines of concurrent measurements (0: none).
func (h *Harness) measureOn(ctx context.Context, c *Case, name string, run int, addr string, admin *Admin, own bool) (map[string]float64, map[string]any, error) {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if own {
		if err := admin.FlushAll(); err != nil {
			return nil, nil, fmt.Errorf("FLUSHALL: %w", err)
		}
	}
	inst, err := newImpl(name)
	if err != nil {
		return nil, nil, err
	}
	env := Env{Addr: addr, Namespace: h.namespace(own), Poll: h.Poll, Logf: h.logf}
	m := &Measure{H: h, Impl: inst, Env: env, Admin: admin, Own: own, run: run}
	if !c.NoOpen {
		if err := inst.Open(ctx, env); err != nil {
			_ = inst.Close()
			h.cleanup(inst, false)
			return nil, nil, err
		}
	}
	vals, err := c.Run(ctx, m)
	if !c.NoOpen {
		if !own {
			h.cleanup(inst, true)
		}
		if cerr := inst.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
		if !own {
			if _, derr := admin.DeleteMatching(inst.KeyPatterns()); derr != nil {
				h.logf("  %s: deleting keys: %v", name, derr)
			}
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && err != nil {
		err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	return vals, m.det, err
}

// cleanup runs the implementation's Cleaner (on a shared server).
func (h *Harness) cleanup(inst Impl, opened bool) {
	if !opened {
		return
	}
	if cl, ok := inst.(Cleaner); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Cleanup(ctx); err != nil {
			h.logf("  %s: cleanup: %v", inst.Name(), err)
		}
	}
}

// parallel calls fn(i) for every i in [0,n) from `workers` goroutines and
// returns the first error (after which no new calls start).
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	var failed atomic.Bool
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				err := ctx.Err()
				if err == nil {
					err = fn(i)
				}
				if err != nil {
					once.Do(func() { first = err; failed.Store(true) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// makeTasks returns n tasks with IDs "0".."n-1", a shared payload of the
// configured size and due times from due (nil: zero).
func (h *Harness) makeTasks(n int, due func(i int) time.Time) []Task {
	payload := make([]byte, h.Sizes.Payload)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	ts := make([]Task, n)
	for i := range ts {
		ts[i] = Task{ID: strconv.Itoa(i), Payload: payload}
		if due != nil {
			ts[i].Due = due(i)
		}
	}
	return ts
}

func needScheduler(i Impl) string {
	if _, ok := i.(Scheduler); !ok {
		return "no delayed tasks"
	}
	return ""
}

func needBatcher(i Impl) string {
	if _, ok := i.(Batcher); !ok {
		return "no batch enqueue API"
	}
	return ""
}

func needBatchScheduler(i Impl) string {
	if _, ok := i.(BatchScheduler); !ok {
		return "no batch schedule API"
	}
	return ""
}

func needDispatcher(i Impl) string {
	if _, ok := i.(Dispatcher); !ok {
		return "no delayed tasks"
	}
	return ""
}

func needNothing(Impl) string { return "" }

// MarshalJSON writes Sizes with durations as strings ("10s").
func (s Sizes) MarshalJSON() ([]byte, error) {
	type plain Sizes // no methods: no recursion
	return json.Marshal(struct {
		plain
		LatenessDuration string
		LatenessMaxDelay string
		IdleDuration     string
	}{plain(s), s.LatenessDuration.String(), s.LatenessMaxDelay.String(), s.IdleDuration.String()})
}
