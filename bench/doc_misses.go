package main

import (
	"fmt"
	"sort"
	"strings"
)

// writeMisses explains, below the target table, each kind of target the
// run missed, with the run's own figures that show why: commands per task
// for end to end, the memory breakdown for bytes per task, the other
// designs' lateness at the same rate. It writes nothing when every target
// was met.
func writeMisses(p func(string, ...any), r *Report, ts []target) {
	missed := map[string]bool{}
	for _, t := range ts {
		if t.met != nil && !*t.met {
			missed[strings.Fields(t.what)[0]] = true
		}
	}
	if len(missed) == 0 {
		return
	}
	p("\n### Why a target is missed\n\n")
	if missed["e2e"] {
		h8 := map[string]any{"handlers": 8}
		p("- **End to end.** Client and Redis share the cores, so the rate follows the work each task costs. With 8 handlers the engine runs %s commands per task in %s round trips, the naive design %s (it has no acknowledgement: a pop and a push), asynq %s, from `INFO commandstats` (*End to end, command by command*). "+
			"What the engine spends beyond naive is its reliability: the record written at enqueue and its done record kept for `DoneRetention`, the claim, the in-flight list and the counters. %s"+
			"The rest are per transaction, shared by the tasks of a claim batch, a result group or an enqueue group: they shrink as batches grow. %s%s\n",
			num(r.find("e2e", "engine", "commands_per_task", h8)), num(r.find("e2e", "engine", "round_trips_per_task", h8)),
			num(r.find("e2e", "naive", "commands_per_task", h8)), num(r.find("e2e", "asynq", "commands_per_task", h8)),
			perTaskFloor(r.find("e2e", "engine", "commands_per_task", h8)), shallowE2E(r, 64),
			cpuSentence(r, "e2e", h8, "the process running the producers, the worker and the dispatcher",
				"*Where the time goes* shows where the client's time goes (`scripts/profiles.sh` profiles this scenario): system calls, the Go scheduler handing tasks and replies between goroutines, and memory allocation; the engine's own functions are a few percent of it.", "engine", "naive", "asynq"))
		if c := e2eClose(r, h8); c != "" {
			p("  %s\n", c)
		}
	}
	if missed["single"] {
		p("- **Single delayed enqueue.** Both designs make one round trip per enqueue, so with one producer the rate is that round trip's latency. The engine's transaction is six commands (`MULTI`, `SET`, `RPUSH`, `ZADD`, `HINCRBY`, `EXEC`) where asynq sends one `EVALSHA`; none can go without breaking the rule that a multi-key change is one transaction. A task alone in its bucket is an inline entry that `ZADD` names, so the transaction has no `RPUSH`. With several producers on one `Client`, group commit shares transactions (`go test -run XXX -bench EnqueueDelayed8 ./engine` reports the commands per task with it and without). %s\n",
			cpuSentence(r, "enqueue", map[string]any{"producers": 1, "batch": 1, "delayed": true}, "the producer's process", "", "engine", "naive", "asynq"))
		if c := enqueueClose(r); c != "" {
			p("  %s\n", c)
		}
	}
	if missed["bytes"] {
		var parts []string
		for _, shape := range []string{"burst", "spread"} {
			res := r.find("memory", "engine", "total", map[string]any{"shape": shape})
			if res == nil || res.Detail == nil {
				continue
			}
			bd, _ := res.Detail["breakdown"].(map[string]any)
			per, _ := bd["bytes_per_task"].(map[string]any)
			f := func(k string) float64 { v, _ := per[k].(float64); return v }
			if per != nil {
				parts = append(parts, fmt.Sprintf("%s: record key %.0f, record value %.0f, bucket lists %.0f, index %.0f, rest %.0f bytes a task",
					shape, f("record_key"), f("record_value"), f("bucket"), f("index"), f("rest")))
			}
		}
		p("- **Bytes per task.** From *Memory, byte by byte*: %s. The record value is the payload plus its header, rounded up to an allocator size class; in one-task buckets each task also pays for a list key of its own and an index member. A task alone in its bucket is scheduled as an inline entry, an index member naming the task with no list. What would close it: fewer bytes in the largest of those parts, which the breakdown names.\n",
			orText(strings.Join(parts, "; "), "no breakdown in this run"))
	}
	if missed["lateness"] {
		for _, rate := range r.intParams("lateness", "rate") {
			want := map[string]any{"rate": rate, "diagnostic": nil} // nil: not the diagnostic case
			p99res := r.find("lateness", "engine", "p99", want)
			p99, ok := median(p99res)
			if !ok || p99 <= 20 {
				continue
			}
			ms := func(impl, metric string) string {
				if v, ok := median(r.find("lateness", impl, metric, want)); ok {
					return formatValue(v, "ms")
				}
				return "n/a"
			}
			w, _ := p99res.Params["workers"].(float64) // as JSON decodes it, like intParams
			workers := int(w)
			p("- **Lateness at %d tasks/s.** The producer, the dispatcher, %d workers and Redis share the cores. The engine's p50 is %s ms and p99 %s ms; at the same rate the naive design's p99 is %s ms and asynq's %s ms. "+
				"At this rate each of the %d handler slots has to turn a task around every %s ms, pop, claim and result included, so tasks wait in the ready list for a free slot. %s\n",
				rate, workers, ms("engine", "p50"), ms("engine", "p99"), ms("naive", "p99"), ms("asynq", "p99"),
				workers, formatValue(float64(workers)*1000/float64(rate), "ms"), latenessDiagnosis(r, rate, workers))
			if res := latenessResolution(r, p99res, want); res != "" {
				p("  %s\n", res)
			}
			if pace := schedulePace(r, want); pace != "" {
				p("  %s\n", pace)
			}
			p("  %s\n", latenessClose(r, want))
		}
	}
	if missed["dispatch"] {
		p("- **Dispatch.** A move costs both sides, built and read back by the client and run by Redis, in transactions of many buckets: for a bucket list a `WATCH` of its key, an `LRANGE`, a `DEL`, a `ZREM` of its index member and an `HMGET` of its retry count; for an inline entry (a task alone in its bucket: the spread rows' backlog, enqueued in batches, is all inline entries) a `ZSCORE` of it under a `WATCH` of its guard, then its `ZREM` and the guard's `INCR`. asynq runs a `ZREM` and an `LPUSH` per task inside one script, so its client does almost nothing. A spread backlog has a bucket per task or so, so it pays that per task. Several dispatchers over a backlog of more buckets than one read take turns (one moves while the others stand by, `docs/design.md`); over fewer, those woken together void each other's `WATCH`es and read again; a burst (few large buckets) is where the bucket design leads. %s %s\n",
			dispatchCPU(r), dispatchClose(r))
	}
}

// shallowE2E says why the engine's e2e run with handlers handlers cost more
// commands per task than with 8 (when it did), from its per-command
// figures: pops that found less than they asked for, and tasks taken out
// of the in-flight list one by one. "" when the run lacks the case or its
// figures.
func shallowE2E(r *Report, handlers int) string {
	want := map[string]any{"handlers": handlers}
	res := r.find("e2e", "engine", "commands_per_task", want)
	cmds, ok := median(res)
	base, okBase := median(r.find("e2e", "engine", "commands_per_task", map[string]any{"handlers": 8}))
	if !ok || !okBase || cmds <= base || res.Detail == nil {
		return ""
	}
	m, _ := res.Detail["commands_per_task_by_command"].(map[string]any)
	pops, ok1 := m["rpoplpush"].(float64)
	lrem, ok2 := m["lrem"].(float64)
	if !ok1 || !ok2 {
		return ""
	}
	producers, _ := res.Params["producers"].(float64)
	trips := num(r.find("e2e", "engine", "round_trips_per_task", want))
	return fmt.Sprintf("With %d handlers the engine runs %.2f commands per task in %s round trips, not fewer: the handlers outrun the %.0f producers, so the ready list runs shallow. Pops ask for more tasks than it holds (`RPOPLPUSH` %.2f per task, one per task finding one), and more tasks leave the in-flight list by an `LREM` of their own (%.2f per task) instead of a batch's one `LTRIM`: those taken one at a time, and those of a batch claimed while another batch's ids were at the list's head. ",
		handlers, cmds, trips, producers, pops, lrem)
}

// num is res's median with two decimals, or "n/a".
func num(res *Result) string {
	if v, ok := median(res); ok {
		return fmt.Sprintf("%.2f", v)
	}
	return "n/a"
}

func orText(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// perTaskFloor names the commands a design's e2e run sent about once per task
// or more (from the run's commands_per_task_by_command), most first: the
// floor no batching lowers.
func perTaskFloor(res *Result) string {
	xs := oncePerTask(res)
	if len(xs) == 0 {
		return ""
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("`%s` %.2f", strings.ToUpper(x.cmd), x.n)
	}
	return "Sent about once per task or more: " + strings.Join(parts, ", ") + " (a pop into the in-flight list is one command per task at Redis 2.4; a done record kept with a TTL is one `SETEX` per task). "
}

// cmdCount is a command and how many of it an e2e run sent per task.
type cmdCount struct {
	cmd string
	n   float64
}

// oncePerTask lists the commands an e2e run sent about once per task or
// more (from its commands_per_task_by_command), most first: the floor no
// batching lowers.
func oncePerTask(res *Result) []cmdCount {
	if res == nil || res.Status != StatusOK || res.Detail == nil {
		return nil
	}
	m, _ := res.Detail["commands_per_task_by_command"].(map[string]any)
	var xs []cmdCount
	for c, v := range m {
		if f, ok := v.(float64); ok && f >= 0.9 {
			xs = append(xs, cmdCount{c, f})
		}
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i].n > xs[j].n || xs[i].n == xs[j].n && xs[i].cmd < xs[j].cmd })
	return xs
}

// cpuSentence says, from a case's CPU figures (cpu.go), what each task
// cost the client side (what) and Redis for each of impls, and how busy the
// cores were in the engine's run, then adds tail. It is empty when the run
// has no such figures.
func cpuSentence(r *Report, scenario string, want map[string]any, what, tail string, impls ...string) string {
	var parts []string
	busy := ""
	for _, impl := range impls {
		c, ok1 := median(r.find(scenario, impl, "client_cpu", want))
		v, ok2 := median(r.find(scenario, impl, "server_cpu", want))
		if !ok1 || !ok2 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f µs + %.1f µs", impl, c, v))
		if impl == "engine" {
			if b, ok := median(r.find(scenario, impl, "cores_busy", want)); ok {
				busy = fmt.Sprintf(" The cores were %.0f%% busy during the engine's run", b)
				if b >= 60 {
					busy += ", so the rate is bound by that CPU time more than by waiting."
				} else {
					busy += ", so much of the time goes to waiting for replies, not to work."
				}
			}
		}
	}
	if len(parts) == 0 {
		return ""
	}
	out := fmt.Sprintf("CPU time per task, %s + Redis (`getrusage` and `INFO cpu` over the measured span): %s.%s", what, strings.Join(parts, ", "), busy)
	if tail != "" {
		out += " " + tail
	}
	return out
}

// dispatchCPU says what a task of the largest spread backlog cost each side
// with one dispatcher.
func dispatchCPU(r *Report) string {
	bl := r.intParams("dispatch", "backlog")
	if len(bl) == 0 {
		return ""
	}
	want := map[string]any{"shape": "spread", "dispatchers": 1, "backlog": bl[len(bl)-1]}
	return cpuSentence(r, "dispatch", want, fmt.Sprintf("spread backlog of %d, one dispatcher: the dispatcher's process", bl[len(bl)-1]), "", "engine", "asynq")
}

// schedulePace says how long each design's producers took to schedule a
// lateness case's tasks (the schedule_seconds detail of its last run),
// and so the rate they kept: a case is named by the rate asked for, and
// producers that cannot keep it load the rest less.
func schedulePace(r *Report, want map[string]any) string {
	var parts []string
	var asked float64
	producers := float64(defaultLatenessProducers) // results from before the case said
	for _, impl := range []string{"engine", "naive", "asynq"} {
		res := r.find("lateness", impl, "p99", want)
		if res == nil {
			continue
		}
		secs, ok := res.Detail["schedule_seconds"].(float64)
		n, _ := res.Params["n"].(float64)
		if !ok || secs <= 0 || n <= 0 {
			continue
		}
		asked, _ = res.Params["seconds"].(float64)
		if v, ok := res.Params["producers"].(float64); ok {
			producers = v
		}
		parts = append(parts, fmt.Sprintf("%s %s s (%s tasks/s)", impl, formatValue(secs, "s"), formatValue(n/secs, "tasks/s")))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("The case asks for its tasks to be scheduled in %.0f s; the producers took (last run) %s. A design whose producers fall behind the rate loads its workers and dispatcher less than the case's name says. `-lateness-producers` sets how many goroutines schedule (%.0f here); with enough to keep the rate, the case also asks the design to run that many tasks a second end to end, which the e2e rates above bound.",
		asked, strings.Join(parts, ", "), producers)
}

// latenessResolution says what the bucket resolution adds to the engine's
// lateness in the case want names, from the engine-1ms figures of the same
// case in the same run, and how far apart the engine's p99 runs (p99) were;
// "" when the run has neither.
func latenessResolution(r *Report, p99 *Result, want map[string]any) string {
	var out []string
	p50, ok1 := median(r.find("lateness", "engine", "p50", want))
	fine50, ok2 := median(r.find("lateness", "engine-1ms", "p50", want))
	fine99, ok3 := median(r.find("lateness", "engine-1ms", "p99", want))
	if ok1 && ok2 && ok3 {
		out = append(out, fmt.Sprintf("A due time is rounded up to its bucket's, so the default 10 ms resolution alone makes a task up to 10 ms late (5 ms on average). With 1 ms buckets (engine-1ms, same case and run) the p50 is %s ms and the p99 %s ms: the resolution accounts for %s ms of the p50. A finer default would cost the moves of bursts (the dispatch rows of engine-1ms).",
			formatValue(fine50, "ms"), formatValue(fine99, "ms"), formatValue(p50-fine50, "ms")))
	}
	if p99.Min != nil && p99.Max != nil && len(p99.Runs) > 1 {
		out = append(out, fmt.Sprintf("The engine's p99 ranged over %s–%s ms across the %d runs of this case: the tail follows how busy the shared cores are.",
			formatValue(*p99.Min, "ms"), formatValue(*p99.Max, "ms"), len(p99.Runs)))
	}
	return strings.Join(out, " ")
}

// latenessDiagnosis says what the diagnostic lateness case (the same rate
// with more handlers, engine only) measured, to tell the wait for a free
// slot from the dispatcher's lateness: its figures and which of the two
// they point to, or how to run it when this run has none.
func latenessDiagnosis(r *Report, rate, workers int) string {
	diag := r.find("lateness", "engine", "p99", map[string]any{"rate": rate, "diagnostic": latenessDiagLabel})
	p99, ok := median(diag)
	if !ok {
		return fmt.Sprintf("`go run . -scenarios lateness -impls engine -lateness-rate %d -lateness-workers %d` runs the same case with four times the handlers, to tell that wait from the dispatcher's.", rate, latenessDiagFactor*workers)
	}
	w, _ := diag.Params["workers"].(float64)
	p50, _ := median(r.find("lateness", "engine", "p50", diag.Params))
	what := "so with more handlers the wait for a free slot goes, and the dispatcher keeps the target"
	if p99 > 20 {
		what = "so more handlers do not close it: the rest is the dispatcher's, or the cores'"
	}
	return fmt.Sprintf("The same case with %.0f handlers (the diagnostic row under *Every figure*) has a p50 of %s ms and a p99 of %s ms, %s.",
		w, formatValue(p50, "ms"), formatValue(p99, "ms"), what)
}

// cpuSplit is a case's client and server CPU time per task (µs).
func cpuSplit(r *Report, scenario, impl string, want map[string]any) (client, server float64, ok bool) {
	c, ok1 := median(r.find(scenario, impl, "client_cpu", want))
	v, ok2 := median(r.find(scenario, impl, "server_cpu", want))
	return c, v, ok1 && ok2
}

// cpuPerTask is a case's client plus server CPU time per task (µs).
func cpuPerTask(r *Report, scenario, impl string, want map[string]any) (float64, bool) {
	c, v, ok := cpuSplit(r, scenario, impl, want)
	return c + v, ok
}

// e2eClose says what would close the e2e misses, from the run's CPU and
// command figures: against asynq, the CPU each task costs; against naive,
// the commands the engine sends once per task or more, which already
// match all that naive sends. "" without the figures.
func e2eClose(r *Report, want map[string]any) string {
	ec, es, ok1 := cpuSplit(r, "e2e", "engine", want)
	nc, ns, ok3 := cpuSplit(r, "e2e", "naive", want)
	eng, nai := ec+es, nc+ns
	naiveCmds, ok4 := median(r.find("e2e", "naive", "commands_per_task", want))
	var out []string
	// Against asynq: the CPU figures of each missed row (8 and 64
	// handlers), by the target table's own verdict.
	for _, h := range []int{8, 64} {
		if t := e2eVsAsynq(r, h); t.met == nil || *t.met {
			continue
		}
		hw := map[string]any{"handlers": h}
		e, ok1 := cpuPerTask(r, "e2e", "engine", hw)
		a, ok2 := cpuPerTask(r, "e2e", "asynq", hw)
		if ok1 && ok2 && e > 0 {
			out = append(out, fmt.Sprintf("against asynq with %d handlers, less CPU per task. Client and Redis together spent %.1f µs a task for asynq and %.1f µs for the engine (%.2f×); with the cores about as busy in both runs the rates differ by about that ratio, so 3× needs the engine's CPU per task below a third of asynq's, and most of it is the client's.",
				h, a, e, a/e))
		}
	}
	if floor := perTaskSum(r.find("e2e", "engine", "commands_per_task", want)); ok4 && floor > 0 {
		out = append(out, fmt.Sprintf("against naive: naive's whole cost is %.2f commands a task, and the engine's commands sent once per task or more add up to %.2f alone: the engine cannot send fewer commands a task than naive.", naiveCmds, floor))
	}
	trips, okt := median(r.find("e2e", "engine", "round_trips_per_task", want))
	if ok1 && ok3 && okt && ec > nc {
		out = append(out, fmt.Sprintf("Redis spent %.1f µs a task on the engine's and %.1f µs on naive's; the clients %.1f µs and %.1f µs (%.1f µs and %.1f µs in all). The engine's client makes %.2f round trips a task, where naive's makes one a command, so what would have to shrink is the engine's client work between round trips (building and reading records and transactions, handing tasks between goroutines, allocation: *Where the time goes*), by about the difference.",
			es, ns, ec, nc, eng, nai, trips))
	}
	return wouldClose(out)
}

// wouldClose joins the accounts of what would close a miss into the
// line that says so ("" when there are none): each account is whole
// sentences, written to follow the colon, so each after the first starts
// with a capital.
func wouldClose(out []string) string {
	if len(out) == 0 {
		return ""
	}
	for i := 1; i < len(out); i++ {
		out[i] = strings.ToUpper(out[i][:1]) + out[i][1:]
	}
	return "What would close it: " + strings.Join(out, " ")
}

// perTaskSum adds up the commands oncePerTask lists.
func perTaskSum(res *Result) float64 {
	sum := 0.0
	for _, x := range oncePerTask(res) {
		sum += x.n
	}
	return sum
}

// enqueueClose says what would close each missed single delayed enqueue
// row: with one producer, the CPU a round trip costs both sides against
// asynq's and naive's; with several, how busy the cores were while one
// group transaction at a time was in flight.
func enqueueClose(r *Report) string {
	var out []string
	missed := func(want map[string]any) bool { // the target table's verdict
		t := ratioRow(r, "", "", 1.2, "enqueue", "rate", want, "engine", "asynq")
		return t.met != nil && !*t.met
	}
	one := map[string]any{"producers": 1, "batch": 1, "delayed": true}
	eng, ok1 := cpuPerTask(r, "enqueue", "engine", one)
	asy, ok2 := cpuPerTask(r, "enqueue", "asynq", one)
	nai, ok3 := cpuPerTask(r, "enqueue", "naive", one)
	if ok1 && ok2 && ok3 && missed(one) {
		need := asy / 1.2
		s := fmt.Sprintf("with one producer the rate is one over the round trip, whose CPU on both sides was %.1f µs for the engine and %.1f µs for asynq; 1.2× needs the engine's below %.1f µs.", eng, asy, need)
		if need < nai {
			s += fmt.Sprintf(" That is less than naive's %.1f µs for a round trip of one command, so it is the round trip's own cost (system calls, waking the caller), not the transaction's commands, that is left.", nai)
		}
		out = append(out, s)
	}
	for _, pr := range r.intParams("enqueue", "producers") {
		if pr <= 1 {
			continue
		}
		want := map[string]any{"producers": pr, "batch": 1, "delayed": true}
		b, ok := median(r.find("enqueue", "engine", "cores_busy", want))
		ab, ok2 := median(r.find("enqueue", "asynq", "cores_busy", want))
		if ok && ok2 && b < ab && missed(want) {
			out = append(out, fmt.Sprintf("with %d producers on one `Client` one group transaction is in flight at a time (`EnqueueGroupLanes` 1), and the cores were %.0f%% busy against asynq's %.0f%%: a second lane overlaps the client's work with the server's, and on a process that only enqueues it is the setting to raise; it is not the default because, where producers share the cores with workers, its smaller and more numerous transactions made scheduled tasks run later (`docs/operations.md`).", pr, b, ab))
		}
	}
	return wouldClose(out)
}

// latenessClose says what would close a missed lateness target, from the
// run's engine-1ms figures for the same case: a finer resolution where
// that meets it, or that neither the resolution nor more handlers do.
func latenessClose(r *Report, want map[string]any) string {
	fine, ok := median(r.find("lateness", "engine-1ms", "p99", want))
	switch {
	case !ok:
		return "What would close it: the engine-1ms column (`-impls engine-1ms`) tells whether a finer resolution does."
	case fine <= 20:
		return fmt.Sprintf("What would close it: a finer resolution where bursts are rare; with 1 ms buckets the p99 was %s ms in this run (the `resolution` setting), at the cost of the moves of bursts (the engine-1ms dispatch rows).", formatValue(fine, "ms"))
	}
	return fmt.Sprintf("What would close it: not the resolution alone (1 ms buckets gave a p99 of %s ms in this run); the tail is the time tasks wait for the shared cores, so fewer commands and less CPU per task end to end, or cores of their own for the workers.", formatValue(fine, "ms"))
}

// dispatchClose says what would close a missed dispatch target, from the
// largest spread backlog's rates with one dispatcher and with the most:
// how much each design gained from more dispatchers, and which side of the
// engine's move cost the most CPU.
func dispatchClose(r *Report) string {
	bl := r.intParams("dispatch", "backlog")
	ds := r.intParams("dispatch", "dispatchers")
	if len(bl) == 0 || len(ds) < 2 {
		return ""
	}
	n, lo, hi := bl[len(bl)-1], ds[0], ds[len(ds)-1]
	gain := func(impl string) (float64, bool) {
		a, ok1 := median(r.find("dispatch", impl, "rate", map[string]any{"shape": "spread", "backlog": n, "dispatchers": lo}))
		b, ok2 := median(r.find("dispatch", impl, "rate", map[string]any{"shape": "spread", "backlog": n, "dispatchers": hi}))
		return b / a, ok1 && ok2 && a > 0
	}
	eg, ok1 := gain("engine")
	ag, ok2 := gain("asynq")
	if !ok1 || !ok2 {
		return ""
	}
	side := "Redis's"
	want := map[string]any{"shape": "spread", "dispatchers": 1, "backlog": n}
	c, okc := median(r.find("dispatch", "engine", "client_cpu", want))
	v, oks := median(r.find("dispatch", "engine", "server_cpu", want))
	if okc && oks && c > v {
		side = "the dispatcher's client"
	}
	return fmt.Sprintf("What would close it: from %d to %d dispatchers over the spread backlog of %d, asynq's rate changed ×%.2f and the engine's ×%.2f. Redis runs one script at a time, so asynq's gain is its clients' work overlapping; the engine's dispatchers take turns, so it gains only from a cheaper move per task, of which %s CPU is the larger part (`BenchmarkMoveSpreadInline` in `buckets` times the move alone).",
		lo, hi, n, ag, eg, side)
}
