package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is what one run found.
type Report struct {
	Scenario, Doc string
	Seed          int64
	Tasks         int
	Shards        int // lanes, each on a redis-server of its own; 0 or 1: one server
	Dir           string
	Duration      time.Duration
	// replayArgs are the chaos command's flags, besides the scenario,
	// tasks, shards and seed, that replay the run.
	replayArgs string

	Enqueued        int // acknowledged: Enqueue/EnqueueBatch returned nil
	Executed        int // acknowledged tasks that ran at least once
	DeadLettered    int // acknowledged tasks that did not run and are dead letters
	Lost            int // acknowledged - executed - dead-lettered
	ExecutedUnacked int // tasks of unacknowledged batches that ran (EXEC ran, the reply was lost)

	DupTasks       int // tasks that ran more than once
	ExtraRuns      int // runs beyond the first
	DupWeak        int // duplicates explained only by weak evidence
	DupUnexplained int // duplicates no interruption explains

	// Interruptions: why a task may run again.
	InterruptedTasks int // tasks with at least one of the below (lease-lost false alarms aside)
	KilledInHandler  int // runs whose handler had started and not ended when the worker got SIGKILL
	ClaimedAtKill    int // ids in a SIGKILLed worker's pending set right after it died
	TakenAtKill      int // ids in its in-flight list (taken, not yet claimed: not runs)
	CutAtShutdown    int // runs cancelled by a graceful stop
	LeaseLost        int // runs whose worker logged that its lease ran out
	LeaseLostAlone   int // of them, for tasks that never ran again: a false alarm
	// RecoveredBeforeRun counts tasks whose first run came after a
	// recovery: claimed, then returned by a reaper before any handler
	// started (a worker killed between claim and handler, or a claim
	// whose reply was lost).
	RecoveredBeforeRun int
	SnapshotsMissing   int // kills after which the worker's holdings could not be read

	Early           int           // runs that started before the due time (producer's clock)
	EarlyBeyond     int           // of them, earlier than EarlyBound
	MaxEarly        time.Duration // the earliest
	EarlyBound      time.Duration // allowed by clock skew
	DueMovedEarlier int           // runs whose record's due time was before the producer's

	LateP50, LateP90, LateP99, LateMax time.Duration // start - due of first runs
	LateOver1s                         int

	Batches, BatchesAcked, BatchesAbsent, BatchesApplied, BatchesPartial int
	BatchesStuck                                                         int // of the partial ones: the rest is in Redis, not run

	// WedgedSlots counts (worker, task) pairs where the worker retried
	// recording a result that could never be recorded.
	WedgedSlots int

	Faults        map[string]int
	Cuts          map[string]int
	Crashes       []string
	LogErrors     map[string]int // error-level log lines by role
	ErrorMessages []string
	Panics        int
	Violations    int
	DeadReasons   map[string]int
	BadData       []BadVerdict

	Failures []string // why the run fails; empty when it passes
	// Unexercised names what the scenario is for and the run did not
	// reach (a fault that never hit, an engine path never taken): the run
	// proves nothing about it, so it does not pass, but nothing was found
	// wrong either; another run (another seed) may reach it.
	Unexercised []string
	Details     []string
	Notes       []string
}

// BadVerdict is what became of one bad-data injection.
type BadVerdict struct {
	Name     string
	Expected string
	Observed string
	OK       bool
}

// OK reports whether the run passed.
func (r *Report) OK() bool { return len(r.Failures) == 0 && len(r.Unexercised) == 0 }

func (r *Report) String() string {
	var b strings.Builder
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	layout, flag := "", ""
	if r.Shards > 1 {
		layout, flag = fmt.Sprintf(", %d shards", r.Shards), fmt.Sprintf(" -shards %d", r.Shards)
	}
	p("=== chaos scenario %q: %s (seed %d, %d tasks%s, %v)", r.Scenario, verdict, r.Seed, r.Tasks, layout, r.Duration.Round(time.Second))
	p("    %s", r.Doc)
	p("    replay: go run ./internal/chaos/cmd/chaos -scenario %s -tasks %d%s%s -seed %d", r.Scenario, r.Tasks, flag, r.replayArgs, r.Seed)
	p("  enqueued (acknowledged)  %d", r.Enqueued)
	p("  executed                 %d", r.Executed)
	p("  lost                     %d", r.Lost)
	p("  dead-lettered            %d", r.DeadLettered)
	p("  ran though unacknowledged %d", r.ExecutedUnacked)
	p("  executed more than once  %d tasks, %d extra runs (unexplained %d, weakly explained %d)",
		r.DupTasks, r.ExtraRuns, r.DupUnexplained, r.DupWeak)
	p("  interrupted              %d tasks: %d in handler at SIGKILL, %d claimed at SIGKILL, %d lease lost, %d cut at graceful stop (%d taken-not-claimed at SIGKILL)",
		r.InterruptedTasks, r.KilledInHandler, r.ClaimedAtKill, r.LeaseLost, r.CutAtShutdown, r.TakenAtKill)
	if r.LeaseLostAlone > 0 || r.RecoveredBeforeRun > 0 {
		p("                           (%d of the lease-lost warnings were false alarms: the task never ran again; %d tasks first ran after a recovery)",
			r.LeaseLostAlone, r.RecoveredBeforeRun)
	}
	p("  executed early           %d runs (max %v; allowed by skew %v; beyond it %d)", r.Early, r.MaxEarly, r.EarlyBound, r.EarlyBeyond)
	p("  lateness                 p50 %v  p90 %v  p99 %v  max %v  (>1s: %d)", r.LateP50, r.LateP90, r.LateP99, r.LateMax, r.LateOver1s)
	p("  batches                  %d: %d acknowledged, unacknowledged %d absent / %d whole / %d PARTIAL",
		r.Batches, r.BatchesAcked, r.BatchesAbsent, r.BatchesApplied, r.BatchesPartial)
	if len(r.Faults) > 0 {
		p("  faults                   %s", fmtCounts(r.Faults))
	}
	if len(r.Cuts) > 0 {
		p("  connection cuts          %s", fmtCounts(r.Cuts))
	}
	if r.SnapshotsMissing > 0 {
		p("  kills without snapshot   %d", r.SnapshotsMissing)
	}
	if len(r.DeadReasons) > 0 {
		p("  dead-letter reasons      %s", fmtCounts(r.DeadReasons))
	}
	if len(r.LogErrors) > 0 {
		p("  error log lines          %s", fmtCounts(r.LogErrors))
		for _, m := range r.ErrorMessages {
			p("      %s", m)
		}
	}
	if len(r.BadData) > 0 {
		p("  bad data:")
		for _, v := range r.BadData {
			mark := "ok  "
			if !v.OK {
				mark = "FAIL"
			}
			p("    %s %-26s expected: %s", mark, v.Name, v.Expected)
			p("         %-26s observed: %s", "", v.Observed)
		}
	}
	for _, n := range r.Notes {
		p("  note: %s", n)
	}
	for _, c := range r.Crashes {
		p("  crash: %s", c)
	}
	for _, f := range r.Failures {
		p("  FAILURE: %s", f)
	}
	for _, u := range r.Unexercised {
		p("  NOT EXERCISED: %s", u)
	}
	for _, d := range r.Details {
		p("    %s", d)
	}
	p("  work dir: %s", r.Dir)
	return b.String()
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// Markdown renders reports as the tables of docs/reliability.md: one row
// per scenario, then the bad-data verdicts of every scenario that injected
// bad data. command is the command line that produced them, printed above
// the tables so that every figure quoted from them names its run.
func Markdown(command string, reps []*Report) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("Generated by `%s` (`-markdown`); do not edit by hand.", command)
	p("")
	p("| scenario | tasks (acknowledged) | faults injected | lost | dead | ran twice / interrupted | unexplained duplicates | early (max; bound) | lateness p50 / p99 / max | partial batches | verdict |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range reps {
		verdict := "pass"
		if !r.OK() {
			verdict = "**FAIL**: " + mdCell(strings.Join(append(slices.Clone(r.Failures), r.Unexercised...), "; "))
		}
		faults := "none"
		if len(r.Faults) > 0 {
			faults = fmtCounts(r.Faults)
		}
		early := "0"
		if r.Early > 0 {
			early = fmt.Sprintf("%d runs (max %v; bound %v)", r.Early, r.MaxEarly.Round(time.Millisecond), r.EarlyBound)
		}
		p("| %s | %d | %s | %d | %d | %d / %d | %d | %s | %s / %s / %s | %d | %s |",
			r.Scenario, r.Enqueued, mdCell(faults), r.Lost, r.DeadLettered, r.DupTasks, r.InterruptedTasks,
			r.DupUnexplained, early, mdDur(r.LateP50), mdDur(r.LateP99), mdDur(r.LateMax), r.BatchesPartial, verdict)
	}
	for _, r := range reps {
		if len(r.BadData) == 0 {
			continue
		}
		p("")
		p("Bad data, scenario `%s`:", r.Scenario)
		p("")
		p("| injection | expected | observed | verdict |")
		p("| --- | --- | --- | --- |")
		for _, v := range r.BadData {
			verdict := "ok"
			if !v.OK {
				verdict = "**FAIL**"
			}
			p("| %s | %s | %s | %s |", mdCell(v.Name), mdCell(v.Expected), mdCell(v.Observed), verdict)
		}
	}
	return b.String()
}

// mdCell makes s safe inside a table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", "\\|")
}

// mdDur rounds a duration for a table: milliseconds below 10 s.
func mdDur(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
