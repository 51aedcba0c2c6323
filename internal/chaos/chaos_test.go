package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"go.uber.org/goleak"
)

// Environment of TestChaos and TestChaosShards.
const (
	envSeed      = "CHAOS_SEED"      // replay a run: the seed it printed
	envTasks     = "CHAOS_TASKS"     // tasks per scenario (defaults: TestChaos, TestChaosShards)
	envScenarios = "CHAOS_SCENARIOS" // comma-separated scenarios, or all (default: the test's own)
)

var (
	buildOnce sync.Once
	procBin   string
	buildErr  error
	procDir   string
)

// buildProc builds chaosproc once for the package's tests.
func buildProc() {
	if procDir, buildErr = os.MkdirTemp("", "chaosproc-"); buildErr == nil {
		procBin, buildErr = BuildProc(context.Background(), procDir, false)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if procDir != "" {
		_ = os.RemoveAll(procDir)
	}
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// TestChaosPeriodic is the short run of the periodic scenario: three
// skewed schedulers of one every-1s entry killed and restarted at random
// for 12 s; every firing of the window runs once, none early; then all of
// them are down for 16 s (more than the 10 s horizon plus the 2 s skew the
// watermark may be ahead by) and one restarts:
// the missed policy "once" runs exactly the latest missed firing.
func TestChaosPeriodic(t *testing.T) {
	runPeriodic(t, PeriodicOptions{Duration: 12 * time.Second, Outage: 16 * time.Second})
}

// TestChaosPeriodicShards is the periodic scenario on three lanes, each on
// a redis-server of its own: the schedulers declare the entry in lane 0
// (as ShardedServer.AddPeriodic does) and are killed and restarted at
// random for 10 s; the dispatcher, reaper and worker are ShardedServers of
// every lane; every firing
// of the window runs once (not once per lane), none early. The
// short form leaves out the outage (the missed policy is lane 0's alone,
// as TestChaosPeriodic covers); the full form is
// `go run ./internal/chaos/cmd/chaos -periodic 60s -shards 3`.
func TestChaosPeriodicShards(t *testing.T) {
	runPeriodic(t, PeriodicOptions{Duration: 10 * time.Second, Shards: 3})
}

// runPeriodic runs the periodic scenario of o's window, outage and layout.
func runPeriodic(t *testing.T, o PeriodicOptions) {
	if _, err := findRedisServer(); err != nil {
		t.Fatalf("%v", err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	seed := uint64(time.Now().UnixNano()%1_000_000_000 + 1)
	if testing.Verbose() {
		o.Log = t.Output()
	}
	o.Bin, o.Dir, o.Seed = procBin, t.TempDir(), seed
	type result struct {
		rep *PeriodicReport
		err error
	}
	done := inPool(func() (r result) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r.rep, r.err = RunPeriodic(ctx, o)
		return r
	})
	t.Parallel()
	res := <-done
	rep, err := res.rep, res.err
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	t.Log(rep.String())
	if !rep.OK() {
		t.Errorf("periodic scenario (seed %d, %d lanes) failed:\n  %s", seed, max(o.Shards, 1), strings.Join(rep.Failures, "\n  "))
	}
}

// TestChaosWorkflow is the short run of the workflow scenario: 60 chains
// of 5 steps and 6 groups of 30 members under worker (and producer)
// kills, connection cuts and redis-server restarts, all at once: every
// chain completes with each step written once, every group's callback
// runs once (extra runs only after a recovery, counted) with the members'
// outcomes. The full form is
// `go run ./internal/chaos/cmd/chaos -workflow 2000x5,200x50`.
func TestChaosWorkflow(t *testing.T) {
	runWorkflow(t, WorkflowOptions{Chains: 60, Steps: 5, Groups: 6, Members: 30})
}

// TestChaosWorkflowShards is the workflow scenario on three lanes, each
// on a redis-server of its own behind its own cutting proxy: a sharded
// producer puts each workflow in the lane its id hashes to, sharded
// workers run them, restarts hit one server at a time, and the checks
// read every lane. The short form is 45 chains of 5 steps and 6 groups
// of 20 members; the full form is
// `go run ./internal/chaos/cmd/chaos -workflow 2000x5,200x50 -shards 3`.
func TestChaosWorkflowShards(t *testing.T) {
	runWorkflow(t, WorkflowOptions{Chains: 45, Steps: 5, Groups: 6, Members: 20, Shards: 3})
}

// runWorkflow runs the workflow scenario of o's sizes and layout under
// every fault at once.
func runWorkflow(t *testing.T, o WorkflowOptions) {
	if _, err := findRedisServer(); err != nil {
		t.Fatalf("%v", err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	seed := uint64(time.Now().UnixNano()%1_000_000_000 + 1)
	if s := os.Getenv(envSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
		seed = n
	}
	if testing.Verbose() {
		o.Log = t.Output()
	}
	o.Bin, o.Dir, o.Seed = procBin, t.TempDir(), seed
	o.KillEvery, o.RestartEvery, o.Cuts, o.Drain = 700*time.Millisecond, 2500*time.Millisecond, true, 60*time.Second
	type result struct {
		rep *WorkflowReport
		err error
	}
	done := inPool(func() (r result) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		r.rep, r.err = RunWorkflow(ctx, o)
		return r
	})
	t.Parallel()
	res := <-done
	rep, err := res.rep, res.err
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	t.Log(rep.String())
	if !rep.OK() {
		t.Errorf("workflow scenario (seed %d, %d lanes) failed:\n  %s", seed, max(o.Shards, 1), strings.Join(rep.Failures, "\n  "))
	}
	if rep.Kills == 0 || rep.Restarts == 0 {
		t.Errorf("the run injected %d kills and %d restarts; it should have injected both", rep.Kills, rep.Restarts)
	}
}

// The short form of a task scenario in the package's tests: production
// over shortDuration, delays up to shortDelayMax. A scenario that names a
// MinDuration keeps it (up to shortMinDuration): the bad-data windows
// and the flow scenario's windows need a steady load that long; and the
// bad-data scenarios with wrong-type lists keep the default delays, whose
// tail keeps tasks coming due after production while the injector, late
// on a loaded machine, holds its last window. The long form,
// `go run ./internal/chaos/cmd/chaos`, keeps the defaults (Options).
const (
	shortDuration    = 2 * time.Second
	shortMinDuration = 25 * time.Second
	shortDelayMax    = 2 * time.Second
)

// shortOptions are a scenario's options in the short form: name's
// production time and delays.
func shortOptions(name string) (Options, error) {
	sc, err := LookupScenario(name)
	if err != nil {
		return Options{}, err
	}
	o := Options{Scenario: name, Duration: max(shortDuration, min(sc.MinDuration, shortMinDuration)), DelayMax: shortDelayMax}
	if sc.BadData >= 2 {
		o.DelayMax = 0
	}
	return o, nil
}

// TestChaos is the short run of every scenario on one redis-server: 400
// tasks each (200 with -short; at most flowTasks in the flow scenario, at
// least badDataTasks in those with wrong-type lists) over 2 s (10 s in
// the bad-data scenarios, 25 s in flow), run in the package's pool
// (inPool). It needs redis-server and fails, not skips, without it. The
// long run is
// `go run ./internal/chaos/cmd/chaos -scenario all -tasks 50000 -seed N`.
func TestChaos(t *testing.T) {
	tasks := 400
	if testing.Short() {
		tasks = 200
	}
	runScenarios(t, 1, tasks)
}

// TestChaosShards runs scenarios of the one table (Scenarios) on three
// lanes, each on a redis-server of its own: producers write batches of
// one ShardKey (one lane each) through a ShardedClient; workers,
// dispatchers and reapers are ShardedServers serving every lane; restarts
// hit one server at a time; each server has its own cutting proxy; bad
// data goes into one lane's keys; the ledger and the namespace check
// (engine check) span the lanes. The short form (CI) runs shardScenarios,
// 300 tasks each (200 with -short), timed as TestChaos's (which runs
// every scenario on one server); CHAOS_SCENARIOS=all runs them all; the
// full form is `go run ./internal/chaos/cmd/chaos -scenario all -shards 3
// -tasks 50000`.
func TestChaosShards(t *testing.T) {
	tasks := 300
	if testing.Short() {
		tasks = 200
	}
	if _, err := findRedisServer(); err != nil {
		t.Fatalf("%v", err)
	}
	runOn(t, 3, tasks, shardScenarios, "")
}

// shardScenarios are the scenarios whose faults act on the lanes apart,
// in their short form: combined (processes that serve every lane killed,
// producers killed mid-batch across lanes, one server cut or restarted
// while the others run, bad data in one lane, all at once), full (one
// server refusing writes while the others take them) and flow (limits
// that hold across lanes). Each of combined's faults alone (workers,
// infra, producers, conncut, kills-restarts) runs sharded with
// CHAOS_SCENARIOS=all; the others (timing of one server's dispatch turn,
// group commit, inline entries, snoozes, chained and prefetched batches,
// clock skew) act within a lane, as on one server, where TestChaos runs
// them.
var shardScenarios = []string{"combined", "full", "flow"}

// TestChaosRedis24 is a short run, on a real Redis 2.4 (REDIS24_SERVER;
// skipped, saying so, without it), of the full scenario and of the faults
// that touch 2.4's own behaviour: connection cuts, server restarts, kills;
// and of flow control under all of them (flow, limit-ahead): 300 tasks
// each (200 with -short), timed as TestChaos's.
func TestChaosRedis24(t *testing.T) {
	if os.Getenv(redistest.EnvBinary24) == "" {
		t.Skipf("%s is not set: the chaos scenarios did not run on a real Redis 2.4", redistest.EnvBinary24)
	}
	tasks := 300
	if testing.Short() {
		tasks = 200
	}
	runOn(t, 1, tasks, []string{"full", "conncut", "kills-restarts", "flow", "limit-ahead"}, os.Getenv(redistest.EnvBinary24))
}

// badDataTasks is the fewest tasks of the short form of a scenario with
// the wrong-type ready and wake-up lists (Scenario.BadData 2): each is
// judged by the runs started while it is wrong against those of as long
// before, and a slower pace leaves the workers idle, blocked on the
// wake-up list, when it turns; the former short form's pace.
const badDataTasks = 600

// flowTasks is the most tasks of the flow scenario's short form, over
// its 25 s: its rates scale with the pace tasks are produced at, and a
// slow pace lets a loaded machine still start tasks as fast as the rates
// allow (which the scenario must see); the redis-server restarts of 25 s
// pile up the backlogs whose release reaches the running limit.
const flowTasks = 500

// runScenarios runs every scenario (or those CHAOS_SCENARIOS names) on
// shards lanes (1: one server), tasks tasks each unless CHAOS_TASKS says
// otherwise, with the seed of CHAOS_SEED or a new one.
func runScenarios(t *testing.T, shards, tasks int) {
	if _, err := findRedisServer(); err != nil {
		t.Fatalf("%v", err)
	}
	runOn(t, shards, tasks, Scenarios(), "")
}

// runsToExercise is how many runs of a scenario, each with its own seed,
// may find nothing wrong without exercising what it is for before the
// test fails.
const runsToExercise = 3

// runOn runs the named scenarios (or those CHAOS_SCENARIOS names) on
// shards lanes of Redis 7, or of the Redis 2.4 at bin24 when set, each
// in the package's pool (inPool); the longest first.
func runOn(t *testing.T, shards, tasks int, names []string, bin24 string) {
	seed := time.Now().UnixNano()%1_000_000_000 + 1
	if s := os.Getenv(envSeed); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
	}
	fixedTasks := false
	if s := os.Getenv(envTasks); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envTasks, s)
		}
		tasks, fixedTasks = n, true
	}
	if s := os.Getenv(envScenarios); s == "all" {
		names = Scenarios()
	} else if s != "" {
		names = strings.Split(s, ",")
	}
	layout := "one server"
	if shards > 1 {
		layout = fmt.Sprintf("%d shards", shards)
	}
	if bin24 != "" {
		layout += " (Redis 2.4)"
	}
	t.Logf("chaos seed %d on %s (replay: %s=%d go test ./internal/chaos -run '^%s$')", seed, layout, envSeed, seed, t.Name())

	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}

	var runs []Options
	for _, name := range names {
		o, err := shortOptions(name)
		if err != nil {
			t.Fatal(err)
		}
		o.Tasks, o.Shards, o.Redis24, o.Bin, o.Drain = tasks, shards, bin24, procBin, 20*time.Second
		sc, _ := LookupScenario(name)
		switch {
		case fixedTasks:
		case name == "flow":
			o.Tasks = min(tasks, flowTasks)
		case sc.BadData >= 2:
			o.Tasks = max(tasks, badDataTasks)
		}
		runs = append(runs, o)
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Duration > runs[j].Duration })
	for _, o := range runs {
		t.Run(o.Scenario, func(t *testing.T) {
			done := inPool(func() struct{} { runScenario(t, o, seed, layout); return struct{}{} })
			t.Parallel()
			<-done
		})
	}
}

// runScenario runs o until a run exercises what its scenario is for, or
// runsToExercise ran, each run with the next seed. It reports through t
// from the pool's goroutine: no FailNow there.
func runScenario(t *testing.T, o Options, seed int64, layout string) {
	if testing.Verbose() {
		o.Log = t.Output()
	}
	// A run that found nothing wrong but did not reach what the
	// scenario is for (on a loaded machine timing decides whether,
	// say, a worker's results and its next pop meet) proves nothing
	// about it: the scenario runs again, with the next seed, until
	// one run reaches it or runsToExercise ran.
	name := o.Scenario
	for run := range runsToExercise {
		o.Seed = seed + int64(run)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		rep, err := Run(ctx, o)
		cancel()
		if err != nil {
			t.Errorf("scenario %s on %s (seed %d): %v", name, layout, o.Seed, err)
			return
		}
		t.Log("\n" + rep.String())
		if len(rep.Failures) > 0 {
			t.Errorf("scenario %s on %s (seed %d) failed:\n  %s\n(logs and ledgers kept in %s)",
				name, layout, o.Seed, strings.Join(rep.Failures, "\n  "), rep.Dir)
			return
		}
		if rep.OK() {
			return
		}
		t.Logf("scenario %s on %s (seed %d), run %d of %d: nothing wrong found, but not exercised: %s",
			name, layout, o.Seed, run+1, runsToExercise, strings.Join(rep.Unexercised, "; "))
	}
	t.Errorf("scenario %s on %s: %d runs found nothing wrong, but none exercised what the scenario is for",
		name, layout, runsToExercise)
}

// The pool of chaos runs: every scenario of the package's tests runs in
// it, poolWidth at a time.
var (
	poolOnce sync.Once
	pool     chan struct{}
)

// poolWidth is how many chaos runs go on at once: twice go test's
// -parallel (by default the cores). A run mostly waits (producers keep a
// set pace, fault loops draw gaps, the last delayed tasks come due), so
// twice as many runs as cores keep them busy without starving any run's
// processes.
func poolWidth() int {
	n := runtime.GOMAXPROCS(0)
	if f := flag.Lookup("test.parallel"); f != nil {
		if p, err := strconv.Atoi(f.Value.String()); err == nil && p > 0 {
			n = p
		}
	}
	return 2 * n
}

// inPool runs f on a goroutine of its own once the pool has room, and
// returns its result's channel. A test starts its run with it and then
// calls t.Parallel(): the runs of every test of the package go on
// meanwhile, poolWidth at a time in the order they were started, instead
// of -parallel at a time behind the tests that wait for theirs.
func inPool[T any](f func() T) <-chan T {
	poolOnce.Do(func() { pool = make(chan struct{}, poolWidth()) })
	out := make(chan T, 1)
	go func() {
		pool <- struct{}{}
		defer func() { <-pool }()
		out <- f()
	}()
	return out
}
