package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDocGeneratedUpToDate: the generated part of docs/benchmarks.md is
// what the renderer writes from the committed results.json, so a change
// to either without regenerating the page fails here.
func TestDocGeneratedUpToDate(t *testing.T) {
	b, err := os.ReadFile("results.json")
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	writeGenerated(&want, &r, "results.json")
	page, err := os.ReadFile("../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end, err := generatedSpan(string(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(page[begin:end]); got != want.String() {
		t.Errorf("docs/benchmarks.md is stale: run `go run . -render results.json -doc ../docs/benchmarks.md` in bench/\n%s", firstDiff(got, want.String()))
	}
}

// writeTestResults writes testReport as dir/results.json and returns its
// path.
func writeTestResults(t *testing.T, dir string) string {
	t.Helper()
	results := filepath.Join(dir, "results.json")
	b, _ := json.Marshal(testReport())
	if err := os.WriteFile(results, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return results
}

// TestRenderKeepsHandWritten: rendering into a page replaces only what
// lies between the markers, marker lines included; the text before and
// after comes through byte for byte, and a second render changes nothing.
func TestRenderKeepsHandWritten(t *testing.T) {
	dir := t.TempDir()
	results := writeTestResults(t, dir)
	before := "# Benchmarks\n\nA reading, with `" + beginMarker + "` quoted inside a line.\n\n"
	after := "\n## Reading the tables\n\nMore reading.\n"
	doc := filepath.Join(dir, "benchmarks.md")
	stale := before + beginMarker + " old -->\n| stale | table |\n" + endMarker + "\n" + after
	if err := os.WriteFile(doc, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	var block strings.Builder
	writeGenerated(&block, testReport(), results)
	for i := range 2 {
		if err := renderDoc(results, doc); err != nil {
			t.Fatal(err)
		}
		page, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if want := before + block.String() + after; string(page) != want {
			t.Fatalf("render %d:\n%s", i+1, firstDiff(string(page), want))
		}
	}
}

// TestRenderNeedsMarkers: a page without exactly one begin and one end
// marker line, in that order, is refused and left as it was.
func TestRenderNeedsMarkers(t *testing.T) {
	dir := t.TempDir()
	results := writeTestResults(t, dir)
	for name, page := range map[string]string{
		"none":     "# Benchmarks\n\nNo tables yet.\n",
		"no end":   beginMarker + " -->\n",
		"two":      beginMarker + " -->\n" + endMarker + "\n" + beginMarker + " -->\n" + endMarker + "\n",
		"reversed": endMarker + "\n" + beginMarker + " -->\n",
		"mid-line": "see `" + beginMarker + "` and `" + endMarker + "`\n",
	} {
		doc := filepath.Join(dir, "page.md")
		if err := os.WriteFile(doc, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := renderDoc(results, doc); err == nil {
			t.Errorf("%s: rendered into %q", name, page)
		}
		if got, _ := os.ReadFile(doc); string(got) != page {
			t.Errorf("%s: page changed to %q", name, got)
		}
	}
}

// testReport is a small run: target rows are ratios of its figures, and
// its breakdown, per-command and idle figures make tables.
func testReport() *Report {
	f := func(v float64) *float64 { return &v }
	res := func(scen, impl, metric string, params map[string]any, v float64, detail map[string]any) *Result {
		return &Result{Scenario: scen, Case: scen + " case", Params: params, Impl: impl, Metric: metric, Unit: "tasks/s",
			Status: StatusOK, Runs: []float64{v}, Median: f(v), Min: f(v), Max: f(v), Detail: detail}
	}
	e2e := map[string]any{"handlers": 8.0}
	return &Report{Meta: map[string]any{"impls": []any{"engine", "asynq", "naive"}, "runs": 1.0, "args": []any{"-runs", "1"}},
		Results: []*Result{
			res("e2e", "engine", "rate", e2e, 30000, nil),
			res("e2e", "asynq", "rate", e2e, 10000, nil),
			res("e2e", "naive", "rate", e2e, 40000, nil),
			res("e2e", "engine", "commands_per_task", e2e, 5.5,
				map[string]any{"commands_per_task_by_command": map[string]any{"rpoplpush": 1.0, "setex": 1.0, "mget": 0.25}}),
			res("e2e", "naive", "commands_per_task", e2e, 2,
				map[string]any{"commands_per_task_by_command": map[string]any{"rpoplpush": 1.0, "lpush": 1.0}}),
			res("e2e", "engine", "round_trips_per_task", e2e, 2.25, nil),
			res("idle", "engine", "commands", map[string]any{}, 0.5,
				map[string]any{"window_seconds": 90.0, "commands_per_second": map[string]any{"blpop": 0.1, "setex": 0.1}}),
			res("idle", "engine", "round_trips", map[string]any{}, 0.25, nil),
			res("memory", "engine", "total", map[string]any{"shape": "spread"}, 400,
				map[string]any{"breakdown": map[string]any{
					"bytes_per_task": map[string]any{"record_key": 88.0, "record_value": 160.0, "rest": 12.5},
					"buckets":        1000.0, "tasks_per_bucket": 1.0}}),
		}}
}

// TestRenderTables: the target rows are computed from the run's figures,
// and its figures are tables; no sentence of explanation is generated.
func TestRenderTables(t *testing.T) {
	var b strings.Builder
	writeGenerated(&b, testReport(), "results.json")
	doc := b.String()
	for _, want := range []string{
		"\n*Generated from `results.json`: `go run . -runs 1`",
		"| e2e no-op tasks/s, 8 handlers, engine vs asynq | ≥ 4× | 3.00× (30k vs 10k) | **missed** |",
		"| e2e no-op tasks/s, 8 handlers, engine vs naive (no acknowledgement) | ≥ 1.0× | 0.75× (30k vs 40k) | **missed** |",
		"| e2e no-op tasks/s, 64 handlers, engine vs asynq | ≥ 4× | not measured in this run | n/a |",
		"0.5 commands/s over 90 s | met",
		"| `BLPOP` | 0.1 |",
		"| **round trips** | 0.25 |",
		"| part | spread |",
		"| record key: dict entry, key name (`t:<id>`), object header | 88.0 |",
		"| index ZSET: the buckets' members and inline entries | - |",
		"| **total** (payload included) | **400** |",
		"| buckets (count) | 1000 |",
		"| tasks per bucket | 1.0 |",
		"| record | - |",
		"| command | engine | naive |",
		"| `RPOPLPUSH` | 1.00 | 1.00 |",
		"| `MGET` | 0.25 | - |",
		"| **all commands** | 5.50 | 2.00 |",
		"| **round trips** | 2.25 | n/a |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the tables lack %q", want)
		}
	}
	// Every line is a marker, a heading, a table row, a caption or the
	// header line: anything else would be a generated sentence.
	for _, line := range strings.Split(strings.TrimSuffix(doc, "\n"), "\n") {
		switch {
		case line == "", strings.HasPrefix(line, beginMarker), line == endMarker,
			strings.HasPrefix(line, "## "), strings.HasPrefix(line, "| "), strings.HasPrefix(line, "*Generated from "),
			strings.HasPrefix(line, "**") && strings.HasSuffix(line, ":"):
		default:
			t.Errorf("generated line is neither table, heading nor caption: %q", line)
		}
	}
}

// TestRenderLatenessTarget: the lateness target reads the target case,
// not the diagnostic one of the same rate (listed first here).
func TestRenderLatenessTarget(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	res := func(impl, metric string, params map[string]any, v float64) *Result {
		return &Result{Scenario: "lateness", Case: "lateness case", Params: params, Impl: impl, Metric: metric, Unit: "ms",
			Status: StatusOK, Runs: []float64{v}, Median: f(v), Min: f(v), Max: f(v)}
	}
	target := map[string]any{"rate": 20000.0, "workers": 16.0}
	diag := map[string]any{"rate": 20000.0, "workers": 64.0, "diagnostic": latenessDiagLabel}
	rep := &Report{Meta: map[string]any{"impls": []any{"engine"}, "runs": 1.0},
		Results: []*Result{
			res("engine", "p50", diag, 8), res("engine", "p99", diag, 15), res("engine", "early", diag, 0),
			res("engine", "p50", target, 12), res("engine", "p99", target, 50), res("engine", "early", target, 0),
		}}
	var b strings.Builder
	writeGenerated(&b, rep, "results.json")
	want := "| lateness p99 at 20000 tasks/s scheduled, engine | ≤ 20 ms, 0 early | p99 50.0 ms, 0.0% early | **missed** |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("the tables lack %q:\n%s", want, b.String())
	}
}

// TestRenderMillionParam: a parameter of a million (the full preset's
// dispatch backlog), which JSON gives back as the float 1e+06, still
// matches the integer the targets look for.
func TestRenderMillionParam(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	res := func(impl string, v float64) *Result {
		return &Result{Scenario: "dispatch", Case: "dispatch case", Impl: impl, Metric: "rate", Unit: "tasks/s", Status: StatusOK,
			Params: map[string]any{"shape": "burst", "backlog": 1e6, "dispatchers": 1.0}, Runs: []float64{v}, Median: f(v), Min: f(v), Max: f(v)}
	}
	rep := &Report{Meta: map[string]any{"impls": []any{"engine", "asynq"}, "runs": 1.0},
		Results: []*Result{res("engine", 1e6), res("asynq", 1e5)}}
	var b strings.Builder
	writeGenerated(&b, rep, "results.json")
	want := "| dispatch burst, backlog 1000000, 1 dispatcher(s), engine vs asynq | ≥ 5× | 10.00× (1M vs 100k) | met |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("the tables lack %q:\n%s", want, b.String())
	}
}

// TestRenderE2ELimit: the e2e-limit scenario's figures come side by side,
// without a limit and with one, per handler count, with the ratio
// limit/no limit of their medians.
func TestRenderE2ELimit(t *testing.T) {
	res := func(hs, limit float64, metric, unit string, vs ...float64) *Result {
		r := &Result{Scenario: "e2e-limit", Case: fmt.Sprintf("handlers=%v limit=%v", hs, limit), Impl: "engine",
			Params: map[string]any{"handlers": hs, "max_running": limit}, Metric: metric, Unit: unit, Status: StatusOK}
		r.setValues(vs)
		return r
	}
	na := &Result{Scenario: "e2e-limit", Case: "handlers=8 limit=1000000", Impl: "engine", Metric: "cores_busy", Unit: "%",
		Params: map[string]any{"handlers": 8.0, "max_running": 1e6}, Status: StatusNA, Note: cpuNA}
	rep := &Report{Meta: map[string]any{"impls": []any{"engine", "naive"}, "runs": 3.0},
		Results: []*Result{
			res(8, 0, "rate", "tasks/s", 20000, 19000, 21000), res(8, 0, "commands_per_task", "cmds/task", 5),
			res(8, 0, "cores_busy", "%", 90),
			res(8, 1e6, "rate", "tasks/s", 15000, 16000, 17000), res(8, 1e6, "commands_per_task", "cmds/task", 6), na,
			res(64, 0, "rate", "tasks/s", 10000),
		}}
	var b strings.Builder
	writeGenerated(&b, rep, "results.json")
	for _, want := range []string{
		"\n## End to end, queue limit against none\n",
		"| handlers | metric | no limit | limit 1000000 | limit / no limit |",
		"| 8 | rate (tasks/s) | 20k (19k–21k) | 16k (15k–17k) | 0.80× |",
		"|  | commands_per_task (cmds/task) | 5.00 | 6.00 | 1.20× |",
		"|  | cores_busy (%) | 90.0 | n/a | n/a |",
		"| 64 | rate (tasks/s) | 10k | - | n/a |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the tables lack %q:\n%s", want, b.String())
		}
	}
}

// TestRenderE2ETargets: the e2e target rows, in the order: per
// handler count the engine against naive and asynq, then on Redis 2.4
// against the run's server (each figure with its server's version, or why
// it is missing), then with a queue limit that never binds against none.
func TestRenderE2ETargets(t *testing.T) {
	res := func(scen, impl string, params map[string]any, v float64, detail map[string]any) *Result {
		r := &Result{Scenario: scen, Case: fmt.Sprint(scen, params), Impl: impl, Params: params, Metric: "rate", Unit: "tasks/s",
			Status: StatusOK, Detail: detail}
		r.setValues([]float64{v})
		return r
	}
	h8, h64 := map[string]any{"handlers": 8.0}, map[string]any{"handlers": 64.0}
	lim := func(h, l float64) map[string]any { return map[string]any{"handlers": h, "max_running": l} }
	v24 := map[string]any{"redis_version": "2.4.18"}
	unset := &Result{Scenario: "e2e24", Case: "64", Impl: "engine", Params: h64, Metric: "rate", Unit: "tasks/s", Status: StatusNA,
		Note: redis24Env + " is not set"}
	rep := &Report{Meta: map[string]any{"impls": []any{"engine", "naive", "asynq"}, "runs": 3.0, "redis_version": "7.0.15",
		"scenarios": []any{"e2e", "e2e24", "e2e-limit"}},
		Results: []*Result{
			res("e2e", "engine", h8, 40000, nil), res("e2e", "naive", h8, 40000, nil), res("e2e", "asynq", h8, 10000, nil),
			res("e2e", "engine", h64, 30000, nil), res("e2e", "naive", h64, 31000, nil), res("e2e", "asynq", h64, 7600, nil),
			res("e2e24", "engine", h8, 30000, v24), unset,
			res("e2e-limit", "engine", lim(8, 0), 20000, nil), res("e2e-limit", "engine", lim(8, 1e6), 19000, nil),
			res("e2e-limit", "engine", lim(64, 0), 20000, nil), res("e2e-limit", "engine", lim(64, 1e6), 10000, nil),
		}}
	rows := []string{
		"| e2e no-op tasks/s, 8 handlers, engine vs naive (no acknowledgement) | ≥ 1.0× | 1.00× (40k vs 40k) | met |",
		"| e2e no-op tasks/s, 8 handlers, engine vs asynq | ≥ 4× | 4.00× (40k vs 10k) | met |",
		"| e2e no-op tasks/s, 64 handlers, engine vs naive (no acknowledgement) | ≥ 1.0× | 0.97× (30k vs 31k) | **missed** |",
		"| e2e no-op tasks/s, 64 handlers, engine vs asynq | ≥ 4× | 3.95× (30k vs 7.6k) | **missed** |",
		"| e2e no-op tasks/s, 8 handlers, engine on Redis 2.4 vs on the run's server | ≥ 0.8× | 0.75× (30k on Redis 2.4.18 vs 40k on Redis 7.0.15) | **missed** |",
		"| e2e no-op tasks/s, 64 handlers, engine on Redis 2.4 vs on the run's server | ≥ 0.8× | not measured in this run (engine, e2e24: " + redis24Env + " is not set) | n/a |",
		"| e2e no-op tasks/s, 8 handlers, engine, queue limit that never binds (1000000) vs none | ≥ 0.9× | 0.95× (19k vs 20k) | met |",
		"| e2e no-op tasks/s, 64 handlers, engine, queue limit that never binds (1000000) vs none | ≥ 0.9× | 0.50× (10k vs 20k) | **missed** |",
		"| bytes per task beyond payload, burst",
	}
	var b strings.Builder
	writeGenerated(&b, rep, "results.json")
	doc := b.String()
	at := strings.Index(doc, "| --- | --- | --- | --- |\n")
	for _, row := range rows {
		i := strings.Index(doc, row)
		if i < 0 {
			t.Errorf("the targets lack %q:\n%s", row, doc)
			continue
		}
		if i < at {
			t.Errorf("%q comes before the row before it in the issue:\n%s", row, doc)
		}
		at = i
	}

	// e2e24 measured again and merged in: its figure and e2e's come from
	// two runs, which make no ratio.
	rep.Parts = []Part{{Scenarios: []string{"e2e24"}, Meta: map[string]any{"args": []any{"-scenarios", "e2e24"}}}}
	b.Reset()
	writeGenerated(&b, rep, "results.json")
	want := "| e2e no-op tasks/s, 8 handlers, engine on Redis 2.4 vs on the run's server | ≥ 0.8× | e2e24 and e2e come from different runs: measure them in one | n/a |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("the targets lack %q:\n%s", want, b.String())
	}
}

// TestRenderFair: the fair scenario's figures come side by side, the
// small task behind the flood without keys and with them.
func TestRenderFair(t *testing.T) {
	res := func(keys bool, metric, unit string, v float64) *Result {
		r := &Result{Scenario: "fair", Case: fmt.Sprintf("keys=%v", keys), Impl: "engine",
			Params: map[string]any{"n": 100000.0, "handlers": 8.0, "keys": keys}, Metric: metric, Unit: unit, Status: StatusOK}
		r.setValues([]float64{v})
		return r
	}
	rep := &Report{Meta: map[string]any{"impls": []any{"engine"}, "runs": 1.0},
		Results: []*Result{
			res(false, "wait", "ms", 5000), res(false, "ahead", "tasks", 100000),
			res(true, "wait", "ms", 2.5), res(true, "ahead", "tasks", 9),
		}}
	var b strings.Builder
	writeGenerated(&b, rep, "results.json")
	for _, want := range []string{
		"\n## One task behind a flood, keys against none\n",
		"| n | metric | no keys | keys flood and small |\n",
		"| 100000 | wait (ms) | 5000 | 2.50 |\n",
		"|  | ahead (tasks) | 100000 | 9 |\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the tables lack %q:\n%s", want, b.String())
		}
	}
}

// firstDiff shows where got and want part, with a little context.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-80)
	return fmt.Sprintf("at byte %d:\ngot:  %s\nwant: %s", i, clip(got[from:], 240), clip(want[from:], 240))
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// TestMerge: a merged run's scenarios replace the base's results of those
// scenarios and nothing else, in the scenarios' order; the page names the
// run each scenario's figures come from, and a later merge of the same
// scenario replaces the earlier one, its run and its notes.
func TestMerge(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	res := func(scen, impl string, v float64) *Result {
		return &Result{Scenario: scen, Case: scen + " case", Params: map[string]any{}, Impl: impl, Metric: "rate", Unit: "tasks/s",
			Status: StatusOK, Runs: []float64{v}, Median: f(v), Min: f(v), Max: f(v)}
	}
	base := &Report{Started: time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC), WallSecs: 1400,
		Meta: map[string]any{"impls": []any{"engine", "asynq"}, "runs": 3.0, "args": []any{"-runs", "3"},
			"scenarios": []any{"enqueue", "e2e", "idle"}},
		Results: []*Result{res("enqueue", "engine", 1), res("enqueue", "asynq", 2), res("e2e", "engine", 3), res("idle", "engine", 4)},
		Notes:   []string{"base note"}}
	// Through JSON, as -merge reads the base from a file.
	b, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(started time.Time, v float64, note string, scens ...string) *Report {
		r := &Report{Started: started, WallSecs: 40, Notes: []string{note},
			Meta: map[string]any{"impls": []string{"engine"}, "runs": 1, "args": []string{"-scenarios", strings.Join(scens, ","), "-runs", "1"}, "scenarios": scens}}
		for _, s := range scens {
			r.Results = append(r.Results, res(s, "engine", v))
		}
		return r
	}
	merged, err := mergeInto(path, run(time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC), 10, "first note", "e2e-limit"))
	if err != nil {
		t.Fatal(err)
	}
	merged, err = mergeInto(writeReport(t, merged), run(time.Date(2026, 11, 29, 5, 30, 0, 0, time.UTC), 20, "second note", "e2e-limit", "e2e"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range merged.Results {
		got = append(got, fmt.Sprintf("%s/%s=%v", r.Scenario, r.Impl, *r.Median))
	}
	if want := "[enqueue/engine=1 enqueue/asynq=2 e2e/engine=20 e2e-limit/engine=20 idle/engine=4]"; fmt.Sprint(got) != want {
		t.Errorf("merged results %v, want %s", got, want)
	}
	var page strings.Builder
	writeGenerated(&page, merged, "results.json")
	doc := page.String()
	for _, want := range []string{
		"*Generated from `results.json`, scenarios enqueue, idle: `go run . -runs 3`, started 2026-11-29 02:00:00 UTC, 1400 s of wall time; 3 run(s) per figure",
		"*Generated from `results.json`, scenarios e2e, e2e-limit: `go run . -scenarios e2e-limit,e2e -runs 1`, started 2026-11-29 05:30:00 UTC, 40 s of wall time; 1 run(s) per figure",
		"- base note\n",
		"- scenarios e2e, e2e-limit: second note\n",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the page lacks %q:\n%s", want, doc)
		}
	}
	for _, gone := range []string{"first note", "05:00:00"} {
		if strings.Contains(doc, gone) {
			t.Errorf("the page still has %q of the replaced merge:\n%s", gone, doc)
		}
	}
}

// writeReport writes r to a results.json in a temporary directory and
// returns its path.
func writeReport(t *testing.T, r *Report) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "results.json")
	if err := r.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	return path
}
