package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// testRedis is the redis-server that TestMain starts for the whole package.
var testRedis *RedisServer

// TestMain lets the test binary act as the idle scenario's child process,
// and starts one redis-server for all tests and benchmarks. A missing
// redis-server is a failure, not a skip (set BQBENCH_REDIS_SERVER to use
// another binary).
func TestMain(m *testing.M) {
	maybeRunChild()
	bin := os.Getenv("BQBENCH_REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	srv, err := StartRedis(context.Background(), bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: cannot start redis-server for the bench tests:", err)
		os.Exit(1)
	}
	testRedis = srv
	code := m.Run()
	srv.Stop()
	os.Exit(code)
}

// tinyArgs are size overrides that make every scenario take about a second.
var tinyArgs = []string{
	"-enqueue-n", "300", "-producers", "1,4", "-batch", "50",
	"-backlog", "200,600", "-dispatchers", "1,2",
	"-e2e-n", "300", "-e2e-producers", "4", "-handlers", "2,8",
	"-lateness-rate", "300", "-lateness-duration", "1s", "-lateness-max-delay", "300ms", "-lateness-workers", "4",
	"-idle-duration", "1s", "-idle-workers", "4", "-idle-periods", "0",
	"-memory-n", "500", "-fair-n", "300", "-fair-handlers", "4",
}

// runTiny runs the harness in-process against the test server (as a shared
// server when shared is set, else as the harness's own) and returns the report.
func runTiny(t *testing.T, shared bool, extra ...string) *Report {
	t.Helper()
	args := append([]string{"-redis", testRedis.Addr, "-out", ""}, tinyArgs...)
	o, err := parseFlags(append(args, extra...))
	if err != nil {
		t.Fatal(err)
	}
	if !shared {
		o.redisAddr = "" // execute would start a server: use the test one as "own"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var rep *Report
	if shared {
		rep, err = execute(ctx, o)
	} else {
		rep, err = executeOn(ctx, o, testRedis.Addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	rep.WriteTable(&sb, o.impls)
	t.Logf("\n%s", sb.String())
	return rep
}

// executeOn is execute with an already running server that the harness may
// treat as its own (FLUSHALL between measurements).
func executeOn(ctx context.Context, o *options, addr string) (*Report, error) {
	h := NewHarness(addr, true, o.sizes, o.runs, o.impls, o.poll, testLog{})
	defer h.Admin.Close()
	h.RedisBin = o.redisBin
	info, err := h.Admin.Info("server")
	if err != nil {
		return nil, err
	}
	h.Report = NewReport(meta(o, addr, true, info))
	var cases []*Case
	for _, s := range o.scenarios {
		cases = append(cases, scenarioCases[s](o.sizes)...)
	}
	h.RunCases(ctx, cases)
	h.Report.Finish(o.impls)
	return h.Report, ctx.Err()
}

// testLog discards progress output (visible with -v through t.Log instead).
type testLog struct{}

func (testLog) Write(p []byte) (int, error) { return len(p), nil }

// want checks every result's status against the expected one per impl.
func want(t *testing.T, rep *Report, status func(r *Result) string) {
	t.Helper()
	if len(rep.Results) == 0 {
		t.Fatal("no results")
	}
	for _, r := range rep.Results {
		if w := status(r); r.Status != w {
			t.Errorf("%s %s %s %s: status %s (%s), want %s", r.Scenario, r.Case, r.Impl, r.Metric, r.Status, r.Note, w)
		}
	}
}

// TestSmokeNaiveAndEngine runs every scenario at tiny sizes against the
// naive implementation and the engine.
func TestSmokeNaiveAndEngine(t *testing.T) {
	rep := runTiny(t, false, "-impls", "naive,engine")
	want(t, rep, func(r *Result) string {
		if (r.Metric == "round_trips" || r.Metric == "round_trips_per_task") && r.Impl == "naive" {
			return StatusNA // only the engine's connections count round trips
		}
		if (r.Params["diagnostic"] != nil || r.Scenario == "e2e-limit" || r.Scenario == "fair" || r.Scenario == "e2e24") && r.Impl != "engine" {
			return StatusNA // the engine's own: a diagnostic case, the cost of its queue limit, its keys, on Redis 2.4
		}
		if r.Scenario == "e2e24" && (os.Getenv(redis24Env) == "" || r.Metric == "commands_per_task") {
			return StatusNA // no Redis 2.4 to start; 2.4 has no INFO commandstats
		}
		return shortCPU(r)
	})
	seen := map[string]bool{}
	busy := 0
	for _, r := range rep.Results {
		seen[r.Scenario] = true
		if r.Metric == "cores_busy" && r.Median != nil {
			busy++
		}
		if r.Median == nil {
			continue
		}
		v := *r.Median
		switch {
		case r.Unit == "tasks/s" && v <= 0:
			t.Errorf("%s %s: rate %v", r.Scenario, r.Case, v)
		case r.Metric == "early" && v != 0:
			t.Errorf("%s started %.2f%% of tasks early", r.Impl, v)
		case r.Scenario == "fair" && r.Metric == "ahead" && r.Params["keys"] == true && v >= 150:
			// Its key is in turn from the first pop: a claim batch or
			// two of the 300 flood tasks at most start before it.
			t.Errorf("fair: %v tasks of the flood started before the small task of another key", v)
		case r.Scenario == "fair" && r.Metric == "ahead" && r.Params["keys"] == false && v < 300-4:
			// First in, first out: only the tasks claimed with it, which
			// other handlers start at the same time, may start after it.
			t.Errorf("fair without keys: %v tasks started before the last one enqueued, want all 300 but a handler's worth", v)
		case r.Metric == "lost" && v != 0:
			t.Errorf("%s lost %v tasks", r.Impl, v)
		case r.Metric == "min" && v < 0:
			t.Errorf("%s started a task %.3fms early", r.Impl, -v)
		case r.Metric == "overhead" && (v <= 0 || v > 2000):
			t.Errorf("implausible memory overhead %v B/task", v)
		case r.Metric == "commands_per_task" && v < 2:
			// A task is pushed once and taken once, at the least.
			t.Errorf("%s %s: %.2f commands per task", r.Impl, r.Case, v)
		case r.Metric == "commands" && r.Impl == "naive" && v <= 0:
			t.Errorf("idle naive: %v commands/s (its poller polls)", v)
		case (r.Metric == "client_cpu" || r.Metric == "server_cpu") && v < 0:
			t.Errorf("%s %s: %s %v µs/task", r.Impl, r.Case, r.Metric, v)
		case r.Metric == "cores_busy" && (v <= 0 || v > 101):
			t.Errorf("%s %s: cores busy %v%%", r.Impl, r.Case, v)
		}
	}
	for _, s := range allScenarios {
		if !seen[s] {
			t.Errorf("scenario %s produced no result", s)
		}
	}
	if busy == 0 {
		t.Error("no case ran long enough for its CPU figures")
	}
	if len(rep.Derived) == 0 {
		t.Error("no dispatch scaling figures")
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
}

// TestSmokeLibraries runs the scenarios that are quick for asynq and rmq
// at tiny sizes, and checks which ones are n/a for rmq.
func TestSmokeLibraries(t *testing.T) {
	if testing.Short() {
		t.Skip("asynq/rmq smoke test skipped in -short mode")
	}
	rep := runTiny(t, false, "-impls", "asynq,rmq", "-scenarios", "enqueue,dispatch,e2e,memory",
		"-backlog", "300", "-dispatchers", "1,2")
	want(t, rep, func(r *Result) string {
		switch {
		case r.Metric == "round_trips_per_task":
			return StatusNA // only the engine's connections count round trips
		case r.Impl == "asynq" && r.Scenario == "enqueue" && strings.HasPrefix(r.Case, "batch"):
			return StatusNA
		case r.Impl == "rmq" && (r.Scenario == "dispatch" || r.Scenario == "memory" ||
			strings.Contains(r.Case, "delayed")):
			return StatusNA
		}
		return shortCPU(r)
	})
}

// shortCPU is the status a result should have when nothing else makes it
// n/a: a CPU figure is left out of a tiny case whose span was too short
// to time (cpuNA), any other figure is measured.
func shortCPU(r *Result) string {
	if isCPUMetric(r.Metric) && r.Status == StatusNA && r.Note == cpuNA {
		return StatusNA
	}
	return StatusOK
}

// TestSharedServer runs against the server as a shared one (-redis): the
// harness must not FLUSHALL it and must leave none of its keys behind.
func TestSharedServer(t *testing.T) {
	c, err := redis.Dial("tcp", testRedis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("SET", "someone-elses-key", "keep"); err != nil {
		t.Fatal(err)
	}
	impls := "naive,asynq,rmq"
	if testing.Short() {
		impls = "naive"
	}
	rep := runTiny(t, true, "-impls", impls, "-scenarios", "enqueue,e2e,idle", "-producers", "2",
		"-handlers", "4")
	want(t, rep, func(r *Result) string {
		if r.Status == StatusNA {
			return StatusNA
		}
		return StatusOK
	})
	keys, err := redis.Strings(c.Do("KEYS", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "someone-elses-key" {
		t.Errorf("keys left on the shared server: %q", keys)
	}
}

// TestParseMonitorLine checks the MONITOR line parser.
func TestParseMonitorLine(t *testing.T) {
	e, ok := parseMonitorLine("+1700000000.123456 [0 lua] \"ZRANGEBYSCORE\" \"k\" \"-inf\"\r\n")
	if !ok || !e.lua || e.cmd != "zrangebyscore" || e.at != 1700000000.123456 {
		t.Errorf("lua line: %+v %v", e, ok)
	}
	e, ok = parseMonitorLine("+1700000000.5 [3 127.0.0.1:5555] \"blpop\" \"q\" \"1\"\r\n")
	if !ok || e.lua || e.cmd != "blpop" {
		t.Errorf("client line: %+v %v", e, ok)
	}
	if _, ok := parseMonitorLine("-ERR nope\r\n"); ok {
		t.Error("error line parsed")
	}
}

// TestTaskEncoding checks encodeTask/decodeTask.
func TestTaskEncoding(t *testing.T) {
	d, err := decodeTask(encodeTask(Task{ID: "42", Payload: []byte("a|b")}))
	if err != nil || d.ID != "42" || string(d.Payload) != "a|b" {
		t.Errorf("got %+v %v", d, err)
	}
	if _, err := decodeTask([]byte("nobar")); err == nil {
		t.Error("malformed blob decoded")
	}
}

// TestFlags checks presets and overrides.
func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"-size", "full", "-backlog", "5,6", "-scenarios", "memory,enqueue"})
	if err != nil {
		t.Fatal(err)
	}
	if o.sizes.MemoryN != 1000000 || fmt.Sprint(o.sizes.Backlogs) != "[5 6]" {
		t.Errorf("sizes %+v", o.sizes)
	}
	if fmt.Sprint(o.scenarios) != "[enqueue memory]" {
		t.Errorf("scenarios %v", o.scenarios)
	}
	for _, bad := range [][]string{{"-size", "huge"}, {"-impls", "nope"}, {"-scenarios", "nope"}, {"-backlog", "x"},
		{"-merge", "results.json", "-out", ""}, {"-render", "results.json", "-merge", "results.json"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestIdleConcurrent runs the idle measurements of two implementations,
// two runs each, at once: every run gets its figures, each on a server of
// its own (the harness's server sees none of their commands).
func TestIdleConcurrent(t *testing.T) {
	checkUntouched := ownServerUntouched(t, "the idle children ran there", "blpop", "rpoplpush", "zrangebyscore")
	rep := runTiny(t, false, "-impls", "naive,engine", "-scenarios", "idle", "-runs", "2")
	want(t, rep, func(r *Result) string {
		if r.Metric == "round_trips" && r.Impl == "naive" {
			return StatusNA
		}
		return StatusOK
	})
	for _, r := range rep.Results {
		if r.Status == StatusOK && len(r.Runs) != 2 {
			t.Errorf("%s %s: %d runs, want 2", r.Impl, r.Metric, len(r.Runs))
		}
	}
	checkUntouched()
}

// ownServerUntouched counts the harness's own server's calls of cmds now;
// the returned check fails the test if any count moved since (why says
// what that would mean).
func ownServerUntouched(t *testing.T, why string, cmds ...string) func() {
	t.Helper()
	admin := NewAdmin(testRedis.Addr)
	t.Cleanup(func() { admin.Close() })
	before, err := admin.CommandCalls()
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		after, err := admin.CommandCalls()
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			if after[cmd] != before[cmd] {
				t.Errorf("the harness's own server saw %d %s: %s", after[cmd]-before[cmd], cmd, why)
			}
		}
	}
}

// TestDispatchScalingRatesOnly: the largest-vs-smallest backlog figures
// compare rates, never the CPU figures reported beside them.
func TestDispatchScalingRatesOnly(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	res := func(backlog int, metric string, v float64) *Result {
		return &Result{Scenario: "dispatch", Impl: "engine", Metric: metric, Status: StatusOK, Median: f(v),
			Params: map[string]any{"shape": "spread", "dispatchers": 1, "backlog": backlog}}
	}
	d := dispatchScaling([]*Result{
		res(10, "rate", 100), res(10, "client_cpu", 5),
		res(100, "rate", 300), res(100, "client_cpu", 7),
	}, []string{"engine"})
	if len(d) != 1 || d[0].Value != 3 {
		t.Fatalf("dispatchScaling = %+v, want one figure of 3 (300/100)", d)
	}
}

// TestDispatchScalingFromJSON: the scaling figures come out the same from
// results read back from a results.json, whose numbers are float64s (a
// merge, -merge, recomputes them so).
func TestDispatchScalingFromJSON(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	res := func(backlog, v float64) *Result {
		return &Result{Scenario: "dispatch", Impl: "engine", Metric: "rate", Status: StatusOK, Median: f(v),
			Params: map[string]any{"shape": "burst", "dispatchers": 1.0, "backlog": backlog}}
	}
	d := dispatchScaling([]*Result{res(1e4, 100), res(1e6, 400)}, []string{"engine"})
	if len(d) != 1 || d[0].Value != 4 || !strings.Contains(d[0].What, "rate(backlog=1000000)/rate(backlog=10000)") {
		t.Fatalf("dispatchScaling = %+v, want one figure of 4 (backlog 1000000 against 10000)", d)
	}
}

// TestRunMerge: a run with -merge writes the base's results with those of
// the scenarios it measured replaced by its own, and a failed run merges
// nothing.
func TestRunMerge(t *testing.T) {
	dir := t.TempDir()
	base := writeTestResults(t, dir)
	out := filepath.Join(dir, "merged.json")
	args := []string{"-redis", testRedis.Addr, "-impls", "engine", "-scenarios", "e2e-limit", "-e2e-n", "200", "-handlers", "2",
		"-merge", base, "-out", out}
	if code := run(args); code != 0 {
		t.Fatalf("run %v: exit %d", args, code)
	}
	r, err := readReport(out)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, res := range r.Results {
		count[res.Scenario]++
	}
	if want := len(testReport().Results); count["e2e"]+count["idle"]+count["memory"] != want || count["e2e-limit"] == 0 {
		t.Errorf("merged results by scenario %v: want the base's %d and e2e-limit's", count, want)
	}
	if len(r.Parts) != 1 || fmt.Sprint(r.Parts[0].Scenarios) != "[e2e-limit]" {
		t.Errorf("parts %+v, want the e2e-limit run", r.Parts)
	}
	// Nothing listens on this address: the run fails, and the base is
	// left as it was.
	before, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	bad := []string{"-redis", "127.0.0.1:1", "-impls", "engine", "-scenarios", "e2e-limit", "-merge", base, "-out", base}
	if code := run(bad); code == 0 {
		t.Errorf("run %v: exit 0", bad)
	}
	if after, _ := os.ReadFile(base); string(after) != string(before) {
		t.Error("a failed run changed the base")
	}
}

// TestE2E24: the e2e24 scenario measures the engine only, each
// measurement on a Redis 2.4 of its own started from REDIS24_SERVER (the
// harness's server sees none of its commands), with e2e's handler counts;
// 2.4 has no INFO commandstats, so commands per task is n/a there.
func TestE2E24(t *testing.T) {
	if os.Getenv(redis24Env) == "" {
		t.Skipf("%s is not set: e2e24 was not run on a real Redis 2.4 (set it to the path of a Redis 2.4 redis-server)", redis24Env)
	}
	checkUntouched := ownServerUntouched(t, "e2e24 ran there", "rpoplpush", "brpoplpush", "multi")
	rep := runTiny(t, true, "-impls", "engine,naive", "-scenarios", "e2e24", "-runs", "2")
	want(t, rep, func(r *Result) string {
		if r.Impl != "engine" || r.Metric == "commands_per_task" {
			return StatusNA
		}
		return shortCPU(r)
	})
	handlers := map[float64]bool{}
	for _, r := range rep.Results {
		if r.Impl == "engine" && r.Metric == "rate" {
			hs, _ := number(r.Params["handlers"])
			handlers[hs] = true
			if v, _ := r.Detail["redis_version"].(string); !strings.HasPrefix(v, "2.4.") {
				t.Errorf("%s: measured on Redis %q", r.Case, v)
			}
			if len(r.Runs) != 2 {
				t.Errorf("%s: %d runs, want 2", r.Case, len(r.Runs))
			}
		}
	}
	if fmt.Sprint(handlers) != "map[2:true 8:true]" {
		t.Errorf("rates for handlers %v, want e2e's 2 and 8", handlers)
	}
	checkUntouched()
}

// TestE2E24Unset: without REDIS24_SERVER, the e2e24 cases do not apply to
// the engine, and the note says why.
func TestE2E24Unset(t *testing.T) {
	t.Setenv(redis24Env, "")
	for _, c := range e2e24Cases(Sizes{Handlers: []int{8, 64}}) {
		if c.RedisBin != "" {
			t.Errorf("%s: server %q", c.Title, c.RedisBin)
		}
		if why := c.Needs(&engineImpl{name: "engine"}); !strings.Contains(why, redis24Env+" is not set") {
			t.Errorf("%s: the engine's reason %q, want one naming %s", c.Title, why, redis24Env)
		}
	}
}

// TestE2E24NotRedis24: a REDIS24_SERVER that starts another version is an
// error, not a figure for 2.4.
func TestE2E24NotRedis24(t *testing.T) {
	bin := os.Getenv("BQBENCH_REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	t.Setenv(redis24Env, bin)
	rep := runTiny(t, false, "-impls", "engine", "-scenarios", "e2e24", "-handlers", "2")
	for _, r := range rep.Results {
		if r.Status != StatusError || !strings.Contains(r.Note, "not 2.4") {
			t.Errorf("%s %s: status %s (%s), want an error saying the server is not 2.4", r.Case, r.Metric, r.Status, r.Note)
		}
	}
}
