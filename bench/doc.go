package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// renderDoc writes docs/benchmarks.md from a results.json: every figure on
// the page comes from the file, so the page is regenerated, never edited.
//
//	cd bench && go run . -render results.json -doc ../docs/benchmarks.md
func renderDoc(resultsPath, docPath, note string) error {
	b, err := os.ReadFile(resultsPath)
	if err != nil {
		return err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", resultsPath, err)
	}
	var out io.Writer = os.Stdout
	if docPath != "" && docPath != "-" {
		f, err := os.Create(docPath)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	return writeDoc(out, &r, resultsPath, note)
}

// find returns the result of scenario for impl and metric whose params
// include every pair of want (compared as text), or nil.
func (r *Report) find(scenario, impl, metric string, want map[string]any) *Result {
	for _, res := range r.Results {
		if res.Scenario != scenario || res.Impl != impl || res.Metric != metric {
			continue
		}
		ok := true
		for k, v := range want {
			if fmt.Sprint(res.Params[k]) != fmt.Sprint(v) {
				ok = false
				break
			}
		}
		if ok {
			return res
		}
	}
	return nil
}

// memoryRow is the target row of bytes per task beyond the payload for
// the engine's memory case of shape (see memoryCases).
func memoryRow(r *Report, shape string, max float64) target {
	what := "bytes per task beyond payload, " + shape + " (" + map[string]string{"burst": "full buckets", "spread": "one-task buckets"}[shape] + ")"
	t := target{what: what, goal: fmt.Sprintf("≤ %.0f", max)}
	if v, ok := median(r.find("memory", "engine", "overhead", map[string]any{"shape": shape})); ok {
		met := v <= max
		t.met, t.measured = &met, fmt.Sprintf("%.0f B", v)
	} else {
		t.measured = "not measured in this run"
	}
	return t
}

// median is res's median, and whether there is one.
func median(res *Result) (float64, bool) {
	if res == nil || res.Status != StatusOK || res.Median == nil {
		return 0, false
	}
	return *res.Median, true
}

// target is one row of the target table.
type target struct {
	what, goal string
	measured   string
	met        *bool
}

func ratioRow(r *Report, what, goal string, min float64, scen, metric string, params map[string]any, a, b string) target {
	x, ok1 := median(r.find(scen, a, metric, params))
	y, ok2 := median(r.find(scen, b, metric, params))
	t := target{what: what, goal: goal}
	if !ok1 || !ok2 || y == 0 {
		t.measured = "not measured in this run"
		return t
	}
	ratio := x / y
	met := ratio >= min
	t.met = &met
	t.measured = fmt.Sprintf("%.2f× (%s vs %s)", ratio, formatValue(x, "tasks/s"), formatValue(y, "tasks/s"))
	return t
}

// e2eVsAsynq is the target row of the e2e rate with h handlers against
// asynq's: the target table's row, and the verdict e2eClose goes by.
func e2eVsAsynq(r *Report, h int) target {
	return ratioRow(r, fmt.Sprintf("e2e no-op tasks/s, %d handlers, engine vs asynq", h), "≥ 3×", 3,
		"e2e", "rate", map[string]any{"handlers": h}, "engine", "asynq")
}

func (r *Report) targets() []target {
	var ts []target
	ts = append(ts,
		e2eVsAsynq(r, 8),
		ratioRow(r, "e2e no-op tasks/s, 8 handlers, engine vs naive (no acknowledgement)", "≥ 1.0×", 1, "e2e", "rate", map[string]any{"handlers": 8}, "engine", "naive"),
		e2eVsAsynq(r, 64),
	)
	for _, p := range r.intParams("enqueue", "producers") {
		ts = append(ts, ratioRow(r, fmt.Sprintf("single delayed enqueue, %d producer(s), engine vs asynq", p), "≥ 1.2×", 1.2,
			"enqueue", "rate", map[string]any{"batch": 1, "delayed": true, "producers": p}, "engine", "asynq"))
	}
	for _, shape := range []struct {
		name string
		max  float64
	}{{"burst", 150}, {"spread", 300}} {
		ts = append(ts, memoryRow(r, shape.name, shape.max))
	}
	for _, rate := range r.intParams("lateness", "rate") {
		t := target{what: fmt.Sprintf("lateness p99 at %d tasks/s scheduled, engine", rate), goal: "≤ 20 ms, 0 early"}
		want := map[string]any{"rate": rate, "diagnostic": nil} // nil: not the diagnostic case
		p99, ok1 := median(r.find("lateness", "engine", "p99", want))
		early, ok2 := median(r.find("lateness", "engine", "early", want))
		if ok1 && ok2 {
			met := p99 <= 20 && early == 0
			t.met, t.measured = &met, fmt.Sprintf("p99 %s ms, %s%% early", formatValue(p99, "ms"), formatValue(early, "%"))
		} else {
			t.measured = "not measured in this run"
		}
		ts = append(ts, t)
	}
	for _, shape := range []string{"burst", "spread"} {
		goal, min := "≥ 5×", 5.0
		if shape == "spread" {
			goal, min = "≥ 1×", 1
		}
		for _, d := range r.intParams("dispatch", "dispatchers") {
			for _, n := range r.intParams("dispatch", "backlog") {
				ts = append(ts, ratioRow(r, fmt.Sprintf("dispatch %s, backlog %d, %d dispatcher(s), engine vs asynq", shape, n, d), goal, min,
					"dispatch", "rate", map[string]any{"shape": shape, "backlog": n, "dispatchers": d}, "engine", "asynq"))
			}
		}
	}
	t := target{what: "idle Redis commands/s, engine (dispatcher + reaper + 16-slot worker, one process)", goal: "≤ 1 over ≥ 60 s"}
	if res := r.findAny("idle", "engine", "commands"); res != nil {
		v, ok := median(res)
		win, _ := res.Detail["window_seconds"].(float64)
		if ok {
			met := v <= 1 && win >= 60
			t.met, t.measured = &met, fmt.Sprintf("%s commands/s over %.0f s", formatValue(v, "cmds/s"), win)
		}
	}
	if t.measured == "" {
		t.measured = "not measured in this run"
	}
	ts = append(ts, t)
	return ts
}

// findAny is find without params.
func (r *Report) findAny(scenario, impl, metric string) *Result {
	return r.find(scenario, impl, metric, nil)
}

// intParams lists the values of param key among scenario's results, sorted.
func (r *Report) intParams(scenario, key string) []int {
	seen := map[int]bool{}
	for _, res := range r.Results {
		if res.Scenario != scenario {
			continue
		}
		if v, ok := res.Params[key].(float64); ok {
			seen[int(v)] = true
		}
	}
	var out []int
	for v := range seen {
		out = append(out, v)
	}
	sort.Ints(out)
	return out
}

func writeDoc(w io.Writer, r *Report, resultsPath, note string) error {
	impls, _ := r.Meta["impls"].([]any)
	var names []string
	for _, i := range impls {
		names = append(names, fmt.Sprint(i))
	}
	args, _ := r.Meta["args"].([]any)
	var argv []string
	for _, a := range args {
		argv = append(argv, fmt.Sprint(a))
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Benchmarks\n\n")
	p("<!-- GENERATED by `cd bench && go run . -render %s -doc ../docs/benchmarks.md` from %s. Do not edit: run the bench again and regenerate. -->\n\n",
		resultsPath, resultsPath)
	p("This page is generated from `%s`, written by the harness in `bench/` (`bench/README.md` explains every flag and figure).\n\n", resultsPath)
	p("**This run.** Started %s UTC, %.0f s of wall time, with `go run . %s`: %v run(s) per figure (median, and (min–max) when several), size preset %v, Redis %v (%s), %v, %v/%v, %v CPUs.",
		r.Started.UTC().Format(time.DateTime), r.WallSecs, strings.Join(argv, " "), r.Meta["runs"], r.Meta["size"], r.Meta["redis_version"],
		map[bool]string{true: "started by the harness, persistence off", false: "an existing server"}[r.Meta["redis_started"] == true],
		r.Meta["go"], r.Meta["goos"], r.Meta["goarch"], r.Meta["cpus"])
	if note != "" {
		p(" %s", note)
	}
	p("\n\n")
	p("```sh\ncd bench && go run . -runs 3                       # what this page shows\ncd bench && go run . -render results.json -doc ../docs/benchmarks.md   # regenerate this page\ncd bench && go run . -redis HOST:PORT                # any server the engine supports, Redis 2.4 included\n```\n\n")

	p("## Targets\n\n| figure | target | measured | verdict |\n| --- | --- | --- | --- |\n")
	ts := r.targets()
	for _, t := range ts {
		verdict := "n/a"
		if t.met != nil {
			verdict = map[bool]string{true: "met", false: "**missed**"}[*t.met]
		}
		p("| %s | %s | %s | %s |\n", t.what, t.goal, t.measured, verdict)
	}
	writeMisses(p, r, ts)
	p("\n## Every figure\n\n")
	p("| scenario | parameters | metric | %s |\n|%s\n", strings.Join(names, " | "), strings.Repeat(" --- |", 3+len(names)))
	type rowKey struct{ scenario, kase, metric string }
	var order []rowKey
	cells := map[rowKey]map[string]*Result{}
	for _, res := range r.Results {
		k := rowKey{res.Scenario, res.Case, res.Metric}
		if cells[k] == nil {
			cells[k] = map[string]*Result{}
			order = append(order, k)
		}
		cells[k][res.Impl] = res
	}
	var prev rowKey
	for _, k := range order {
		scen, kase := k.scenario, k.kase
		if k.scenario == prev.scenario {
			scen = ""
			if k.kase == prev.kase {
				kase = ""
			}
		}
		prev = k
		unit := ""
		var row []string
		for _, impl := range names {
			res := cells[k][impl]
			if res == nil {
				row = append(row, "-")
				continue
			}
			unit = res.Unit
			row = append(row, cellText(res))
		}
		p("| %s | %s | %s | %s |\n", scen, kase, metricLabel(k.metric, unit), strings.Join(row, " | "))
	}
	if len(r.Derived) > 0 {
		p("\nDispatch rate, largest backlog against smallest:\n\n")
		for _, d := range r.Derived {
			p("- %s: %s\n", d.Impl, d.Text)
		}
	}
	writeMemoryBreakdown(p, r, names)
	p("\n## End to end, command by command\n\n")
	if !writeE2ECommands(p, r, names) {
		p("Not measured in this run (or the server has no `INFO commandstats`).\n\n")
	}
	p("\n## Idle, command by command\n\n")
	idle := false
	for _, impl := range names {
		res := r.findAny("idle", impl, "commands")
		if res == nil {
			res = r.findAny("idle", impl, "client_commands")
		}
		if res == nil || res.Status != StatusOK || res.Detail == nil {
			continue
		}
		idle = true
		win, _ := res.Detail["window_seconds"].(float64)
		p("**%s**, %.0f s window (longest idle period %v s): commands Redis executed per second, by command (`INFO commandstats` deltas; `INFO` left out):\n\n", impl, win, res.Detail["longest_idle_period_seconds"])
		per, _ := res.Detail["commands_per_second"].(map[string]any)
		if len(per) == 0 {
			per, _ = res.Detail["client_commands_per_second"].(map[string]any)
		}
		var cmds []string
		for c := range per {
			cmds = append(cmds, c)
		}
		sort.Slice(cmds, func(i, j int) bool {
			a, _ := per[cmds[i]].(float64)
			b, _ := per[cmds[j]].(float64)
			return a > b || (a == b && cmds[i] < cmds[j])
		})
		p("| command | per second |\n| --- | --- |\n")
		for _, c := range cmds {
			v, _ := per[c].(float64)
			p("| `%s` | %s |\n", strings.ToUpper(c), fmtRate(v))
		}
		rt := r.findAny("idle", impl, "round_trips")
		if v, ok := median(rt); ok {
			p("\nRound trips per second (counted by the implementation's own connections; a pipeline is one): %s.\n", fmtRate(v))
		}
		p("\n")
	}
	if !idle {
		p("Not measured in this run.\n\n")
	}
	if len(r.Notes) > 0 {
		p("## Notes of the run\n\n")
		for _, n := range r.Notes {
			p("- %s\n", n)
		}
		p("\n")
	}
	_, err := io.WriteString(w, docProse)
	return err
}

func fmtRate(v float64) string {
	if v == 0 || math.Abs(v) >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// writeMemoryBreakdown renders, per implementation that reported one, the
// memory scenario's breakdown: bytes per task by part, a column per case.
func writeMemoryBreakdown(p func(string, ...any), r *Report, names []string) {
	p("\n## Memory, byte by byte\n\n")
	found := false
	for _, impl := range names {
		var cases []*Result
		for _, res := range r.Results {
			if res.Scenario == "memory" && res.Impl == impl && res.Metric == "total" && res.Status == StatusOK && res.Detail["breakdown"] != nil {
				cases = append(cases, res)
			}
		}
		if len(cases) == 0 {
			continue
		}
		found = true
		p("**%s**: bytes per task, from `MEMORY USAGE` of every key of the namespace before and after (differences over the tasks scheduled):\n\n", impl)
		p("| part |")
		for _, c := range cases {
			p(" %v |", c.Params["shape"])
		}
		p("\n| --- |%s\n", strings.Repeat(" --- |", len(cases)))
		bd := make([]map[string]any, len(cases))
		for i, c := range cases {
			bd[i], _ = c.Detail["breakdown"].(map[string]any)
		}
		for _, row := range breakdownRows {
			p("| %s |", row.Label)
			for i := range cases {
				per, _ := bd[i]["bytes_per_task"].(map[string]any)
				v, ok := per[row.Key].(float64)
				if !ok {
					p(" - |")
					continue
				}
				p(" %.1f |", v)
			}
			p("\n")
		}
		p("| **total** (payload included) |")
		for _, c := range cases {
			v, _ := median(c)
			p(" **%.0f** |", v)
		}
		p("\n\nSizes behind them:\n\n")
		for i, c := range cases {
			b := bd[i]
			f := func(k string) float64 { v, _ := b[k].(float64); return v }
			p("- %v: records of %.1f bytes on average under key names of %.0f bytes; %.0f buckets of %.1f tasks on average, bucket key names of %.0f bytes, ids of %.0f bytes (%.0f bytes of `MEMORY USAGE` a bucket); %.0f index members of %.0f bytes (%.1f bytes of the index each).\n",
				c.Params["shape"], f("record_bytes_avg"), f("record_key_name_avg"), f("buckets"), f("tasks_per_bucket"),
				f("bucket_key_name_avg"), f("bucket_id_avg"), f("bucket_usage_avg"), f("index_members"), f("index_member_avg"), f("index_usage_per_member"))
		}
		p("\n")
	}
	if !found {
		p("Not measured in this run (the breakdown needs `MEMORY USAGE`, Redis 4 or later).\n\n")
	}
	p("%s", memoryProse)
}

// writeE2ECommands writes, for each handler count of the e2e scenario,
// the commands Redis executed per task by each design, command by
// command, with the totals and the round trips per task; false when no
// e2e result carries the figures.
func writeE2ECommands(p func(string, ...any), r *Report, names []string) bool {
	wrote := false
	for _, hs := range r.intParams("e2e", "handlers") {
		want := map[string]any{"handlers": hs}
		per := map[string]map[string]any{}
		var impls []string
		for _, impl := range names {
			res := r.find("e2e", impl, "commands_per_task", want)
			if res == nil || res.Status != StatusOK || res.Detail == nil {
				continue
			}
			m, _ := res.Detail["commands_per_task_by_command"].(map[string]any)
			if len(m) == 0 {
				continue
			}
			per[impl] = m
			impls = append(impls, impl)
		}
		if len(impls) == 0 {
			continue
		}
		wrote = true
		p("**%d handlers**: commands Redis executed per task, from the first enqueue to the last handler call (`INFO commandstats` deltas over the tasks, last run; `INFO` left out). A design's figure is the client CPU and the server work each task costs; a pipeline or a `MULTI` block still sends each command.\n\n", hs)
		seen := map[string]float64{}
		for _, impl := range impls {
			for c, v := range per[impl] {
				f, _ := v.(float64)
				seen[c] = max(seen[c], f)
			}
		}
		var cmds []string
		for c := range seen {
			cmds = append(cmds, c)
		}
		sort.Slice(cmds, func(i, j int) bool {
			return seen[cmds[i]] > seen[cmds[j]] || (seen[cmds[i]] == seen[cmds[j]] && cmds[i] < cmds[j])
		})
		p("| command | %s |\n|%s\n", strings.Join(impls, " | "), strings.Repeat(" --- |", len(impls)+1))
		for _, c := range cmds {
			row := make([]string, len(impls))
			for i, impl := range impls {
				row[i] = "-"
				if v, ok := per[impl][c].(float64); ok {
					row[i] = fmt.Sprintf("%.2f", v)
				}
			}
			p("| `%s` | %s |\n", strings.ToUpper(c), strings.Join(row, " | "))
		}
		for _, m := range []struct{ key, label string }{
			{"commands_per_task", "**all commands**"},
			{"round_trips_per_task", "**round trips** (the design's own count; a pipeline is one)"},
		} {
			row := make([]string, len(impls))
			for i, impl := range impls {
				row[i] = "n/a"
				if v, ok := median(r.find("e2e", impl, m.key, want)); ok {
					row[i] = fmt.Sprintf("%.2f", v)
				}
			}
			p("| %s | %s |\n", m.label, strings.Join(row, " | "))
		}
		p("\n")
	}
	return wrote
}
