package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// The generated part of docs/benchmarks.md lies between a line starting
// with beginMarker and a line starting with endMarker; the hand-written text
// around it is the page's own.
const (
	beginMarker = "<!-- BEGIN GENERATED"
	endMarker   = "<!-- END GENERATED -->"
)

// renderDoc renders the tables of a results.json and puts them between
// the markers of the page at docPath, leaving the rest of the page as it
// is; with docPath "-" it writes them to stdout.
//
//	cd bench && go run . -render results.json -doc ../docs/benchmarks.md
func renderDoc(resultsPath, docPath string) error {
	r, err := readReport(resultsPath)
	if err != nil {
		return err
	}
	var block strings.Builder
	writeGenerated(&block, r, resultsPath)
	if docPath == "" || docPath == "-" {
		_, err := io.WriteString(os.Stdout, block.String())
		return err
	}
	page, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	out, err := spliceGenerated(string(page), block.String())
	if err != nil {
		return fmt.Errorf("%s: %w", docPath, err)
	}
	return os.WriteFile(docPath, []byte(out), 0o644)
}

// spliceGenerated replaces the generated part of page, its marker lines
// included, with block (which carries its own markers).
func spliceGenerated(page, block string) (string, error) {
	begin, end, err := generatedSpan(page)
	if err != nil {
		return "", err
	}
	return page[:begin] + block + page[end:], nil
}

// generatedSpan is where page's generated part starts and ends: from the
// start of its begin marker's line to past the end marker's line. Each
// marker must start a line, once.
func generatedSpan(page string) (begin, end int, err error) {
	find := func(marker string) (int, error) {
		at := -1
		for i := 0; i < len(page); {
			line, _, _ := strings.Cut(page[i:], "\n")
			if strings.HasPrefix(line, marker) {
				if at >= 0 {
					return 0, fmt.Errorf("more than one line starts with %q", marker)
				}
				at = i
			}
			i += len(line) + 1
		}
		if at < 0 {
			return 0, fmt.Errorf("no line starts with %q", marker)
		}
		return at, nil
	}
	if begin, err = find(beginMarker); err != nil {
		return 0, 0, err
	}
	if end, err = find(endMarker); err != nil {
		return 0, 0, err
	}
	if end < begin {
		return 0, 0, fmt.Errorf("%q comes before %q", endMarker, beginMarker)
	}
	end += len(endMarker)
	if end < len(page) && page[end] == '\n' {
		end++
	}
	return begin, end, nil
}

// find returns the result of scenario for impl and metric whose params
// include every pair of want (sameParam), or nil.
func (r *Report) find(scenario, impl, metric string, want map[string]any) *Result {
	for _, res := range r.Results {
		if res.Scenario != scenario || res.Impl != impl || res.Metric != metric {
			continue
		}
		ok := true
		for k, v := range want {
			if !sameParam(res.Params[k], v) {
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

// sameParam reports whether two parameter values are equal: numbers by
// value (a results.json gives every number back as a float64, which
// prints a million as 1e+06), anything else as text.
func sameParam(a, b any) bool {
	x, ok1 := number(a)
	y, ok2 := number(b)
	if ok1 && ok2 {
		return x == y
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// number is v as a float64, if it is a number.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
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

// figure names one median of a report: a metric of impl in scenario, in
// the case whose params include every pair of params; label follows the
// value in a target row ("" for none).
type figure struct {
	scenario, impl string
	params         map[string]any
	label          string
}

// ratioRow is the target row of the ratio of two implementations' metric
// in one case of scen.
func ratioRow(r *Report, what, goal string, min float64, scen, metric string, params map[string]any, a, b string) target {
	return ratioOf(r, what, goal, min, metric, figure{scen, a, params, ""}, figure{scen, b, params, ""})
}

// ratioOf is the target row of metric's ratio a / b, met when at least
// min: both figures in the measured column. Figures of two runs (a
// scenario merged in apart from the other) make no ratio: compare within
// one run. A figure that was not measured says why where its result does.
func ratioOf(r *Report, what, goal string, min float64, metric string, a, b figure) target {
	t := target{what: what, goal: goal}
	ra, rb := r.find(a.scenario, a.impl, metric, a.params), r.find(b.scenario, b.impl, metric, b.params)
	x, ok1 := median(ra)
	y, ok2 := median(rb)
	if !ok1 || !ok2 || y == 0 {
		t.measured = "not measured in this run"
		for _, res := range []*Result{ra, rb} {
			if res != nil && res.Status != StatusOK && res.Note != "" {
				t.measured += " (" + res.Impl + ", " + res.Scenario + ": " + res.Note + ")"
				break
			}
		}
		return t
	}
	if r.runOf(a.scenario) != r.runOf(b.scenario) {
		t.measured = fmt.Sprintf("%s and %s come from different runs: measure them in one", a.scenario, b.scenario)
		return t
	}
	ratio := x / y
	met := ratio >= min
	t.met = &met
	t.measured = fmt.Sprintf("%.2f× (%s%s vs %s%s)", ratio, formatValue(x, "tasks/s"), a.label, formatValue(y, "tasks/s"), b.label)
	return t
}

// e2eHandlers are the handler counts of the e2e target rows.
var e2eHandlers = []int{8, 64}

// e2eName begins the what of every e2e target row with h handlers.
func e2eName(h int) string { return fmt.Sprintf("e2e no-op tasks/s, %d handlers, engine", h) }

// e2eVs are the target rows of the engine's e2e rate with h handlers
// against naive's and asynq's.
func e2eVs(r *Report, h int) []target {
	hs := map[string]any{"handlers": h}
	return []target{
		ratioRow(r, e2eName(h)+" vs naive (no acknowledgement)", "≥ 1.0×", 1, "e2e", "rate", hs, "engine", "naive"),
		ratioRow(r, e2eName(h)+" vs asynq", "≥ 4×", 4, "e2e", "rate", hs, "engine", "asynq"),
	}
}

// e2eOn24 is the target row of the engine's e2e rate with h handlers on
// Redis 2.4 (e2e24) against its rate on the run's server (e2e), each
// figure with its server's version.
func e2eOn24(r *Report, h int) target {
	hs := map[string]any{"handlers": h}
	v24 := "2.4"
	if res := r.find("e2e24", "engine", "rate", hs); res != nil && res.Detail["redis_version"] != nil {
		v24 = fmt.Sprint(res.Detail["redis_version"])
	}
	on := ""
	if v, ok := r.runMeta("e2e")["redis_version"].(string); ok && v != "" {
		on = " on Redis " + v
	}
	return ratioOf(r, e2eName(h)+" on Redis 2.4 vs on the run's server", "≥ 0.8×", 0.8, "rate",
		figure{"e2e24", "engine", hs, " on Redis " + v24}, figure{"e2e", "engine", hs, on})
}

// e2eLimitRow is the target row of the engine's e2e rate with h handlers
// and a queue limit that never binds against none (e2e-limit).
func e2eLimitRow(r *Report, h int) target {
	lim := e2eLimitMaxRunning
	if ls := r.intParams("e2e-limit", "max_running"); len(ls) > 0 {
		lim = ls[len(ls)-1]
	}
	return ratioOf(r, fmt.Sprintf("%s, queue limit that never binds (%d) vs none", e2eName(h), lim), "≥ 0.9×", 0.9, "rate",
		figure{"e2e-limit", "engine", map[string]any{"handlers": h, "max_running": lim}, ""},
		figure{"e2e-limit", "engine", map[string]any{"handlers": h, "max_running": 0}, ""})
}

func (r *Report) targets() []target {
	var ts []target
	for _, h := range e2eHandlers {
		ts = append(ts, e2eVs(r, h)...)
	}
	for _, h := range e2eHandlers {
		ts = append(ts, e2eOn24(r, h))
	}
	for _, h := range e2eHandlers {
		ts = append(ts, e2eLimitRow(r, h))
	}
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

// writeGenerated writes the generated part of the page, markers
// included: a line saying what it was generated from, then the tables.
func writeGenerated(w io.Writer, r *Report, resultsPath string) {
	names := reportImpls(r)
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("%s: written by `cd bench && go run . -render %s -doc ../docs/benchmarks.md`; edit only outside the markers -->\n\n", beginMarker, resultsPath)
	if len(r.Parts) == 0 {
		writeRunLine(p, resultsPath, nil, r.Started, r.WallSecs, r.Meta)
	} else {
		writeRunLine(p, resultsPath, r.ownScenarios(), r.Started, r.WallSecs, r.Meta)
		for _, part := range r.Parts {
			p("\n")
			writeRunLine(p, resultsPath, part.Scenarios, part.Started, part.WallSecs, part.Meta)
		}
	}

	p("\n## Targets\n\n| figure | target | measured | verdict |\n| --- | --- | --- | --- |\n")
	for _, t := range r.targets() {
		verdict := "n/a"
		if t.met != nil {
			verdict = map[bool]string{true: "met", false: "**missed**"}[*t.met]
		}
		p("| %s | %s | %s | %s |\n", t.what, t.goal, t.measured, verdict)
	}

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
		p("\n| implementation | dispatch rate, smallest backlog → largest |\n| --- | --- |\n")
		for _, d := range r.Derived {
			p("| %s | %s |\n", d.Impl, strings.Join(strings.Fields(d.Text), " "))
		}
	}
	writeMemoryBreakdown(p, r, names)
	writeE2ECommands(p, r, names)
	writeE2ELimit(p, r)
	writeFair(p, r)
	writeIdleCommands(p, r, names)
	notes := slices.Clone(r.Notes)
	for _, part := range r.Parts {
		for _, n := range part.Notes {
			notes = append(notes, "scenarios "+scenarioList(part.Scenarios)+": "+n)
		}
	}
	if len(notes) > 0 {
		p("\n## Notes of the run\n\n")
		for _, n := range notes {
			p("- %s\n", n)
		}
	}
	p("\n%s\n", endMarker)
}

// writeRunLine writes the line that says which run the figures (of
// scenarios; nil: all of them) come from.
func writeRunLine(p func(string, ...any), resultsPath string, scenarios []string, started time.Time, wall float64, meta map[string]any) {
	from := "`" + resultsPath + "`"
	if scenarios != nil {
		from += ", scenarios " + scenarioList(scenarios)
	}
	p("*Generated from %s: `go run . %s`, started %s UTC, %.0f s of wall time; %v run(s) per figure, size preset %v; Redis %v (%s); %v %v/%v, %v CPUs.*\n",
		from, strings.Join(strList(meta["args"]), " "), started.UTC().Format(time.DateTime), wall, meta["runs"], meta["size"], meta["redis_version"],
		map[bool]string{true: "started by the harness, persistence off", false: "an existing server"}[meta["redis_started"] == true],
		meta["go"], meta["goos"], meta["goarch"], meta["cpus"])
}

// writeIdleCommands writes, per implementation with an idle figure, the
// commands per second Redis executed (or, without `INFO commandstats`,
// the clients sent) by command, and the round trips per second where the
// design counts them.
func writeIdleCommands(p func(string, ...any), r *Report, names []string) {
	heading := false
	for _, impl := range names {
		res := r.findAny("idle", impl, "commands")
		if res == nil {
			res = r.findAny("idle", impl, "client_commands")
		}
		if res == nil || res.Status != StatusOK || res.Detail == nil {
			continue
		}
		if !heading {
			p("\n## Idle, command by command\n")
			heading = true
		}
		win, _ := res.Detail["window_seconds"].(float64)
		p("\n**%s**, %.0f s window (longest idle period %v s):\n\n", impl, win, res.Detail["longest_idle_period_seconds"])
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
		if v, ok := median(r.findAny("idle", impl, "round_trips")); ok {
			p("| **round trips** | %s |\n", fmtRate(v))
		}
	}
}

func fmtRate(v float64) string {
	if v == 0 || math.Abs(v) >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// writeMemoryBreakdown writes, per implementation that reported one, the
// memory scenario's breakdown, a column per case: bytes per task by part,
// then the sizes behind them.
func writeMemoryBreakdown(p func(string, ...any), r *Report, names []string) {
	heading := false
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
		if !heading {
			p("\n## Memory, byte by byte\n")
			heading = true
		}
		bd := make([]map[string]any, len(cases))
		for i, c := range cases {
			bd[i], _ = c.Detail["breakdown"].(map[string]any)
		}
		header := func(first string) {
			p("| %s |", first)
			for _, c := range cases {
				p(" %s |", fmt.Sprint(c.Params["shape"]))
			}
			p("\n| --- |%s\n", strings.Repeat(" --- |", len(cases)))
		}
		p("\n**%s**, bytes per task:\n\n", impl)
		header("part")
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
		p("\n\n**%s**, the sizes behind them (averages in bytes, and counts):\n\n", impl)
		header("size")
		for _, row := range breakdownSizes {
			p("| %s |", row.label)
			for i := range cases {
				v, ok := bd[i][row.key].(float64)
				if !ok {
					p(" - |")
					continue
				}
				p(" "+row.format+" |", v)
			}
			p("\n")
		}
	}
}

// breakdownSizes are the rows of the sizes behind a memory breakdown:
// keys of its detail, and how each is printed.
var breakdownSizes = []struct{ key, label, format string }{
	{"record_bytes_avg", "record", "%.1f"},
	{"record_key_name_avg", "record key name", "%.0f"},
	{"buckets", "buckets (count)", "%.0f"},
	{"tasks_per_bucket", "tasks per bucket", "%.1f"},
	{"bucket_key_name_avg", "bucket key name", "%.0f"},
	{"bucket_id_avg", "id in a bucket list", "%.0f"},
	{"bucket_usage_avg", "`MEMORY USAGE` of a bucket", "%.0f"},
	{"index_members", "index members (count)", "%.0f"},
	{"index_member_avg", "index member", "%.0f"},
	{"index_usage_per_member", "index usage per member", "%.1f"},
}

// writeE2ECommands writes, for each handler count of the e2e scenario,
// the commands Redis executed per task by each design, command by
// command, with the totals and the round trips per task.
func writeE2ECommands(p func(string, ...any), r *Report, names []string) {
	heading := false
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
		if !heading {
			p("\n## End to end, command by command\n")
			heading = true
		}
		p("\n**%d handlers**, commands per task (last run):\n\n", hs)
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
			{"round_trips_per_task", "**round trips**"},
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
	}
}

// writeE2ELimit writes the engine's e2e-limit figures side by side: per
// handler count and metric, the case without a queue limit, the one with
// the (never reached) limit, and the ratio of their medians.
func writeE2ELimit(p func(string, ...any), r *Report) {
	limits := r.intParams("e2e-limit", "max_running")
	if len(limits) == 0 {
		return
	}
	limit := limits[len(limits)-1]
	p("\n## End to end, queue limit against none\n\n")
	writeSideBySide(p, r, "e2e-limit", "handlers", "max_running",
		[2]any{0, limit}, [2]string{"no limit", fmt.Sprintf("limit %d", limit)}, "limit / no limit")
}

// writeFair writes the engine's fair figures side by side: per count of
// tasks ahead, the small task behind them without keys and with keys.
func writeFair(p func(string, ...any), r *Report) {
	if len(r.intParams("fair", "n")) == 0 {
		return
	}
	p("\n## One task behind a flood, keys against none\n\n")
	writeSideBySide(p, r, "fair", "n", "keys", [2]any{false, true}, [2]string{"no keys", "keys flood and small"}, "")
}

// writeSideBySide writes a table of the engine's figures of scenario in
// two variants, where param variant is values[0] and values[1] (headed
// labels), and, under ratioLabel unless it is "", the ratio of their
// medians (second / first): a group of rows per value of param group, a
// row per metric.
func writeSideBySide(p func(string, ...any), r *Report, scenario, group, variant string, values [2]any, labels [2]string, ratioLabel string) {
	if ratioLabel == "" {
		p("| %s | metric | %s | %s |\n| --- | --- | --- | --- |\n", group, labels[0], labels[1])
	} else {
		p("| %s | metric | %s | %s | %s |\n| --- | --- | --- | --- | --- |\n", group, labels[0], labels[1], ratioLabel)
	}
	for _, g := range r.intParams(scenario, group) {
		var metrics []string
		seen := map[string]bool{}
		for _, res := range r.Results {
			if res.Scenario == scenario && res.Impl == "engine" && sameParam(res.Params[group], g) && !seen[res.Metric] {
				seen[res.Metric] = true
				metrics = append(metrics, res.Metric)
			}
		}
		first := fmt.Sprint(g)
		for _, m := range metrics {
			var pair [2]*Result
			unit := ""
			for i, v := range values {
				pair[i] = r.find(scenario, "engine", m, map[string]any{group: g, variant: v})
				if pair[i] != nil {
					unit = pair[i].Unit
				}
			}
			cell := func(res *Result) string {
				if res == nil {
					return "-"
				}
				return cellText(res)
			}
			p("| %s | %s | %s | %s |", first, metricLabel(m, unit), cell(pair[0]), cell(pair[1]))
			if ratioLabel != "" {
				ratio := "n/a"
				x, ok1 := median(pair[1])
				y, ok2 := median(pair[0])
				if ok1 && ok2 && y != 0 {
					ratio = fmt.Sprintf("%.2f×", x/y)
				}
				p(" %s |", ratio)
			}
			p("\n")
			first = ""
		}
	}
}
