package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
	"github.com/gomodule/redigo/redis"
)

// observed is what the ledgers say.
type observed struct {
	acked     map[string]ledger.Acked
	batches   map[string]*ledger.Batch
	runs      map[string][]*ledger.Run // by task id, in start order
	batchRuns map[string]map[int]bool  // batch id -> indices that ran
	payload   map[string]string        // task id -> payload word
	// calls and execs sum the producers' last G lines: enqueue calls
	// made and EXECs sent (Scenario.Groups).
	calls, execs int64
	// chained sums the workers' last C lines: batches taken with the
	// results before them (Scenario.Chained).
	chained int64
	// ahead: tasks workers claimed ahead of their slots (Scenario.Ahead).
	ahead int64
}

func (h *harness) collect() (*observed, error) {
	o := &observed{acked: map[string]ledger.Acked{}, batches: map[string]*ledger.Batch{},
		runs: map[string][]*ledger.Run{}, batchRuns: map[string]map[int]bool{}, payload: map[string]string{}}
	for _, p := range h.allProcs() {
		if p.LedgerPath == "" {
			continue
		}
		if _, err := os.Stat(p.LedgerPath); err != nil {
			continue // killed before it wrote anything
		}
		switch p.Role {
		case roleProducer:
			pl, err := ledger.ReadProducer(p.LedgerPath)
			if err != nil {
				return nil, err
			}
			for _, b := range pl.Batches {
				o.batches[b.ID] = b
			}
			for _, a := range pl.Acked {
				o.acked[a.ID] = a
			}
			o.calls += pl.Calls
			o.execs += pl.Execs
		case roleWorker:
			runs, err := ledger.ReadHandler(p.LedgerPath)
			if err != nil {
				return nil, err
			}
			n, err := ledger.ReadChained(p.LedgerPath)
			if err != nil {
				return nil, err
			}
			o.chained += n
			if n, err = ledger.ReadAhead(p.LedgerPath); err != nil {
				return nil, err
			}
			o.ahead += n
			for _, r := range runs {
				o.runs[r.ID] = append(o.runs[r.ID], r)
				o.payload[r.ID] = r.Payload
				if bid, i, ok := parseBatchPayload(r.Payload); ok {
					if o.batchRuns[bid] == nil {
						o.batchRuns[bid] = map[int]bool{}
					}
					o.batchRuns[bid][i] = true
				}
			}
		}
	}
	for _, rs := range o.runs {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	}
	if h.sc.Expire > 0 {
		if err := h.expiredOfBatches(o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// expiredOfBatches counts, in the batches' runs, the tasks of a batch
// that expired unstarted (dead letters whose reason says so): a batch
// whose call failed but was written is whole when its tasks ran or
// expired, and its ids are in no ledger.
func (h *harness) expiredOfBatches(o *observed) error {
	for _, l := range h.lanes {
		c := l.admin.Get()
		ids, err := redis.Strings(c.Do("ZRANGE", l.keys.Dead(), 0, -1))
		var raws [][]byte
		if err == nil && len(ids) > 0 {
			raws, err = redis.ByteSlices(c.Do("MGET", redis.Args{}.AddFlat(l.keys.Tasks(ids))...))
		}
		c.Close()
		if err != nil {
			return err
		}
		for i, raw := range raws {
			r, err := buckets.DecodeRecord(ids[i], raw)
			if err != nil || !strings.HasPrefix(r.LastError, buckets.ReasonExpired+":") {
				continue
			}
			if bid, n, ok := parseBatchPayload(ledger.PayloadWord(r.Payload)); ok {
				if o.batchRuns[bid] == nil {
					o.batchRuns[bid] = map[int]bool{}
				}
				o.batchRuns[bid][n] = true
			}
		}
	}
	return nil
}

// parseBatchPayload reads "batch:<bid>:<i>".
func parseBatchPayload(p string) (bid string, i int, ok bool) {
	rest, found := strings.CutPrefix(p, "batch:")
	if !found {
		return "", 0, false
	}
	j := strings.LastIndexByte(rest, ':')
	if j <= 0 {
		return "", 0, false
	}
	i, err := strconv.Atoi(rest[j+1:])
	return rest[:j], i, err == nil
}

func (o *observed) maxDue() int64 {
	var m int64
	for _, a := range o.acked {
		m = max(m, a.Due-a.Offset) // in real time
	}
	return m
}

// outstanding counts acknowledged tasks that neither ran nor are dead
// letters, plus batches that ran in part.
func (o *observed) outstanding(dead map[string]bool) int {
	n := 0
	for id := range o.acked {
		if len(o.runs[id]) == 0 && !dead[id] {
			n++
		}
	}
	for bid, got := range o.batchRuns {
		if b := o.batches[bid]; b != nil && !b.Acked && len(got) < b.N {
			n++
		}
	}
	return n
}

// interruption is a reason a task may run again: a run cut short.
type interruption struct {
	pid      int
	reason   string
	weak     bool
	leaseLog bool // from a worker's lease-lost log line
}

// interruptions are, per task id, what explains its extra runs.
type interruptions map[string][]interruption

// add records in for task id. A process interrupts a task once, whatever
// the evidence says it was doing (killed in the handler, holding the
// claim, a lease lost), except that two of its lease-lost log lines are
// two runs: the finisher logs at most one per run, as it drops the run's
// result (finisher.notOurs, or the lease ending before the result could
// be recorded), so a worker that lost the same task's lease twice ran it
// twice.
func (m interruptions) add(id string, in interruption) {
	for _, x := range m[id] {
		if x.pid == in.pid && !x.weak && !(x.leaseLog && in.leaseLog) {
			return
		}
	}
	m[id] = append(m[id], in)
}

// check judges a finished run from the ledgers, the processes' logs and
// Redis: each phase below adds its figures to the report, and verdict
// turns them into failures.
func (h *harness) check(ctx context.Context) *Report {
	rep := &Report{Scenario: h.sc.Name, Doc: h.sc.Doc, Seed: h.seed, Tasks: h.opts.Tasks, Shards: len(h.lanes), Dir: h.dir, replayArgs: h.replayArgs,
		Duration: time.Since(h.started), Faults: map[string]int{}, LogErrors: map[string]int{},
		DeadReasons: map[string]int{}}
	c := &checker{h: h, rep: rep, inter: interruptions{}, reaped: map[string]bool{}}
	obs, err := h.collect()
	if err != nil {
		c.fail("reading the ledgers: %v", err)
		return rep
	}
	c.obs = obs
	c.faults()
	c.deadLetters(ctx)
	c.runs()
	c.interruptions()
	c.logs()
	c.weakEvidence()
	c.duplicates()
	c.batches()
	c.crashesAndBadData()
	c.verdict()
	c.scenarioChecks()
	return rep
}

// checker is one check's state, shared by its phases.
type checker struct {
	h      *harness
	rep    *Report
	obs    *observed
	kills  []*killEvent
	killed map[int]*killEvent // by pid
	crash  []crash
	dead   map[string]string // dead letters: id → reason
	inter  interruptions
	bound  time.Duration // how early a run may start (earlyBound)
	// reaped are the worker ids a reaper found dead and returned tasks of.
	reaped map[string]bool

	lost, unexplained, wedged []string
}

func (c *checker) fail(format string, args ...any) {
	c.rep.Failures = append(c.rep.Failures, fmt.Sprintf(format, args...))
}

// faults counts the faults injected.
func (c *checker) faults() {
	h, rep := c.h, c.rep
	// Faults injected.
	h.mu.Lock()
	kills := append([]*killEvent(nil), h.kills...)
	restarts := append([]restartEvent(nil), h.restarts...)
	c.crash = append([]crash(nil), h.crashes...)
	h.mu.Unlock()
	killed := map[int]*killEvent{}
	c.kills, c.killed = kills, killed
	for _, k := range kills {
		if k.Self {
			rep.Faults["SIGKILL producer (itself, mid-call)"]++
		} else {
			rep.Faults[fmt.Sprintf("%s %s", sigName(k.Signal), k.Role)]++
		}
		killed[k.PID] = k
		if k.SnapshotErr != nil {
			rep.SnapshotsMissing++
		}
	}
	var maxDown time.Duration
	for _, r := range restarts {
		rep.Faults[fmt.Sprintf("redis-server %s + restart", sigName(r.Signal))]++
		maxDown = max(maxDown, r.Down)
	}
	if len(restarts) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("longest redis-server outage %v", maxDown.Round(time.Millisecond)))
	}
	if len(h.proxies) > 0 {
		rep.Cuts, rep.Faults["connection cuts"] = h.cuts()
	}
	if n := h.fills.Load(); n > 0 {
		rep.Faults["server full"] = int(n)
		if e := h.evicted.Load(); e > 0 {
			rep.Faults["keys evicted"] = int(e)
		}
	}

}

// deadLetters reads the dead letters, through the public API and the
// index.
func (c *checker) deadLetters(ctx context.Context) {
	h := c.h
	// Dead letters, through the public API.
	dead := map[string]string{}
	c.dead = dead
	if in, err := h.shardedAdmin(); err != nil {
		c.fail("inspector: %v", err)
	} else {
		opts := engine.ListOptions{Filter: engine.Filter{State: engine.StateDead}, Limit: 1000}
		for {
			page, err := in.ListTasks(ctx, opts)
			if err != nil {
				c.fail("dead letters: %v", err)
				break
			}
			for _, ti := range page.Tasks {
				// Whole: a check looks for words in it (firstLine shortens
				// it for display only).
				dead[ti.ID], _, _ = strings.Cut(ti.LastError, "\n")
			}
			if page.Next == "" {
				break
			}
			opts.Cursor = page.Next
		}
	}
	// Ids that are not UUIDs do not come back from DeadLetters' lookups;
	// the index has them all.
	if ids, err := h.deadSet(); err == nil {
		for id := range ids {
			if _, ok := dead[id]; !ok {
				dead[id] = "(listed in the dead-letter index)"
			}
		}
	}

}

// runs counts the acknowledged tasks that ran, were lost or are dead, and
// how early or late each started.
func (c *checker) runs() {
	h, rep, obs, dead := c.h, c.rep, c.obs, c.dead
	// Enqueued, executed, lost, dead.
	rep.Enqueued = len(obs.acked)
	var lost []string
	var lateness []time.Duration
	bound := h.earlyBound()
	c.bound = bound
	rep.EarlyBound = bound
	for id, a := range obs.acked {
		runs := obs.runs[id]
		if len(runs) == 0 {
			if reason, ok := dead[id]; ok {
				rep.DeadLettered++
				if strings.HasPrefix(reason, "expired: ") {
					reason = "expired" // the rest is the task's own expiry
				}
				rep.DeadReasons[reason]++
				continue
			}
			lost = append(lost, id)
			continue
		}
		rep.Executed++
		for _, r := range runs {
			early := time.Duration(a.Due-(r.Start+a.Offset)) * time.Millisecond
			if early > 0 {
				rep.Early++
				rep.MaxEarly = max(rep.MaxEarly, early)
				if early > bound+2*time.Millisecond {
					rep.EarlyBeyond++
				}
			}
			if r.Due < a.Due {
				rep.DueMovedEarlier++
			}
		}
		lateness = append(lateness, time.Duration(runs[0].Start+a.Offset-a.Due)*time.Millisecond)
		if runs[0].Recoveries > 0 {
			rep.RecoveredBeforeRun++
		}
	}
	rep.Lost = len(lost)
	c.lost = lost
	sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
	if n := len(lateness); n > 0 {
		pct := func(p float64) time.Duration { return lateness[min(n-1, int(p*float64(n)))] }
		rep.LateP50, rep.LateP90, rep.LateP99, rep.LateMax = pct(0.50), pct(0.90), pct(0.99), lateness[n-1]
		for _, l := range lateness {
			if l > time.Second {
				rep.LateOver1s++
			}
		}
	}
	for id, runs := range obs.runs {
		if _, ok := obs.acked[id]; !ok && len(runs) > 0 && strings.HasPrefix(runs[0].Payload, "batch:") {
			rep.ExecutedUnacked++
		}
	}

}

// interruptions records what interrupted runs: kills during a handler,
// claims held at a kill.
func (c *checker) interruptions() {
	rep, obs, killed, add := c.rep, c.obs, c.killed, c.inter.add
	// Duplicates and what explains them.
	for id, runs := range obs.runs {
		for _, r := range runs {
			k := killed[r.PID]
			if k == nil || r.End != 0 {
				continue
			}
			switch k.Signal {
			case syscall.SIGKILL:
				rep.KilledInHandler++
				add(id, interruption{pid: r.PID, reason: "in its handler when the worker was killed"})
			case syscall.SIGTERM:
				rep.CutAtShutdown++
				add(id, interruption{pid: r.PID, reason: "handler cancelled at graceful shutdown"})
			}
		}
	}
	for _, k := range c.kills {
		for _, id := range k.Pending {
			rep.ClaimedAtKill++
			add(id, interruption{pid: k.PID, reason: "claimed by the worker when it was killed"})
		}
		rep.TakenAtKill += len(k.Inflight)
	}
}

// logs reads every process's log: lost leases, errors, panics, 2.4
// violations and wedged slots.
func (c *checker) logs() {
	h, rep, obs, killed, add := c.h, c.rep, c.obs, c.killed, c.inter.add
	errMsgs := map[string]int{}
	for _, p := range h.allProcs() {
		ls := scanLog(p.LogPath)
		for _, id := range ls.LeaseLost {
			rep.LeaseLost++
			if len(obs.runs[id]) < 2 {
				rep.LeaseLostAlone++
			}
			add(id, interruption{pid: p.PID, reason: "its lease ran out; the worker's result was dropped", leaseLog: true})
		}
		for _, id := range ls.Expired {
			rep.LeaseLost++
			add(id, interruption{pid: p.PID, reason: "it ran past its lease"})
		}
		if k := killed[p.PID]; k != nil && k.Signal == syscall.SIGKILL {
			// The handler had ended, but recording its result kept
			// failing (Redis down, cut) until the process was killed: the
			// run still held its lease.
			for id := range ls.Unrecorded {
				add(id, interruption{pid: p.PID, reason: "its result was not yet recorded when the worker was killed"})
			}
		}
		for _, w := range ls.Reaped {
			c.reaped[w] = true
		}
		if ls.Errors > 0 {
			rep.LogErrors[p.Role] += ls.Errors
		}
		for m, n := range ls.Messages {
			errMsgs[p.Role+": "+m] += n
		}
		rep.Panics += ls.Panics
		rep.Violations += ls.Violations
		for _, id := range sortedKeys(ls.Wedged) {
			if ls.Wedged[id] >= 2 {
				rep.WedgedSlots++
				c.wedged = append(c.wedged, fmt.Sprintf("%s retried %d+ times to record the result of task %s (payload %s): %s",
					p.Name, ls.Wedged[id], id, orStr(obs.payload[id], "?"), firstLine(ls.WedgedErr[id])))
			}
		}
	}
	for _, m := range sortedKeys(errMsgs) {
		rep.ErrorMessages = append(rep.ErrorMessages, fmt.Sprintf("%5d x %s", errMsgs[m], m))
	}
}

// weakEvidence adds the interruptions that may explain a duplicate, and
// counts the tasks some run of which was interrupted.
func (c *checker) weakEvidence() {
	h, rep, obs, killed, inter := c.h, c.rep, c.obs, c.killed, c.inter
	// Weak evidence: a run that ended in a process killed later, when what
	// the worker held could not be read (Redis was down).
	for id, runs := range obs.runs {
		for _, r := range runs {
			if k := killed[r.PID]; k != nil && k.Signal == syscall.SIGKILL && k.SnapshotErr != nil && r.End != 0 {
				inter[id] = append(inter[id], interruption{pid: r.PID, weak: true,
					reason: "ended in a worker killed later, whose holdings could not be read"})
			}
		}
	}
	c.reapedAfterKill()
	// A server that evicted keys with a TTL while full (a volatile
	// policy: Scenario.Full on 2.4) may have evicted a live worker's
	// heartbeat: a reaper then recovers its tasks while they run, a lost
	// lease. Two runs on either side of a recovery are explained by it,
	// weakly, in either order: the recovered run may start first while
	// the worker that lost its lease still holds the task claimed ahead
	// of a free slot, and starts it a moment later.
	if h.evicted.Load() > 0 {
		for id, runs := range obs.runs {
			for i, r := range runs {
				if i > 0 && r.Recoveries != runs[i-1].Recoveries {
					inter[id] = append(inter[id], interruption{pid: runs[i-1].PID, weak: true,
						reason: "recovered while the server evicted keys with a TTL (a heartbeat): a lost lease"})
				}
			}
		}
	}
	for id := range inter {
		strong := 0
		for _, x := range inter[id] {
			// A lease-lost warning for a task that never ran again was a
			// false alarm (a retried result that found its own commit).
			if !x.weak && !(x.leaseLog && len(obs.runs[id]) < 2) {
				strong++
			}
		}
		if strong > 0 {
			rep.InterruptedTasks++
		}
	}
}

// reapedAfterKill adds weak evidence for a run that ended in a worker
// killed later, and ran again after a recovery, when a reaper found that
// worker dead and returned tasks of it: the run's result was not yet
// recorded at the kill (the task was still claimed), though the kill's
// snapshot of what the worker held missed it (read after the reaper, on
// a loaded machine, or not read).
func (c *checker) reapedAfterKill() {
	for id, runs := range c.obs.runs {
		for i := 1; i < len(runs); i++ {
			prev := runs[i-1]
			k := c.killed[prev.PID]
			if k == nil || k.Signal != syscall.SIGKILL || prev.End == 0 || runs[i].Recoveries <= prev.Recoveries {
				continue
			}
			for _, w := range k.WorkerIDs {
				if c.reaped[w] {
					c.inter[id] = append(c.inter[id], interruption{pid: prev.PID, weak: true,
						reason: "ended in a worker killed later, which a reaper found dead and recovered tasks of"})
					break
				}
			}
		}
	}
}

// duplicates counts the tasks that ran more than once, and those the
// interruptions do not explain.
func (c *checker) duplicates() {
	rep, obs, inter := c.rep, c.obs, c.inter
	for id, runs := range obs.runs {
		if len(runs) < 2 {
			continue
		}
		rep.DupTasks++
		extra := len(runs) - 1
		rep.ExtraRuns += extra
		strong, weak := 0, 0
		for _, x := range inter[id] {
			if x.weak {
				weak++
			} else {
				strong++
			}
		}
		switch {
		case extra <= strong:
		case extra <= strong+weak:
			rep.DupWeak++
		default:
			rep.DupUnexplained++
			c.unexplained = append(c.unexplained, id)
		}
	}

}

// batches checks that every batch was all or nothing.
func (c *checker) batches() {
	h, rep, obs := c.h, c.rep, c.obs
	// Batches: all or nothing.
	failedRan := map[string]int{}
	var pws map[string]*partialWhere
	for bid, b := range obs.batches {
		rep.Batches++
		got := len(obs.batchRuns[bid])
		switch {
		case b.Acked:
			rep.BatchesAcked++
		case got == 0:
			rep.BatchesAbsent++
		case got == b.N:
			rep.BatchesApplied++
			if b.Failed != "" {
				failedRan[errClass(b.Failed)]++
			}
		default:
			rep.BatchesPartial++
			if pws == nil {
				if pws = h.partialWhere; pws == nil {
					pws = h.partialLocations(obs)
				}
			}
			pw := pws[bid]
			if pw != nil && pw.allFound {
				rep.BatchesStuck++
			}
			rep.Details = append(rep.Details, fmt.Sprintf("batch %s (%d tasks, not acknowledged: %s) ran in part: %d of %d",
				bid, b.N, orStr(b.Failed, "producer killed during the call"), got, b.N))
			if pw != nil {
				for _, l := range pw.lines {
					rep.Details = append(rep.Details, "  "+l)
				}
			}
		}
	}
	if len(failedRan) > 0 {
		rep.Notes = append(rep.Notes, "unacknowledged batches that ran whole although EnqueueBatch returned an error: "+fmtCounts(failedRan))
	}
	for bid := range obs.batchRuns {
		if obs.batches[bid] == nil {
			c.fail("tasks of batch %s ran, but no producer ledger announced that batch", bid)
		}
	}

}

// crashesAndBadData reports the processes that exited on their own and
// the bad data's verdicts.
func (c *checker) crashesAndBadData() {
	h, rep, obs, dead := c.h, c.rep, c.obs, c.dead
	// Crashes.
	for _, c := range c.crash {
		rep.Crashes = append(rep.Crashes, fmt.Sprintf("%s (pid %d) exited with code %d; last lines of %s:\n%s",
			c.Name, c.PID, c.ExitCode, c.LogPath, indent(tail(c.LogPath, 15))))
	}

	// Bad data.
	if h.bad != nil {
		rep.BadData = h.bad.verdicts(obs, dead)
		if len(h.lanes) > 1 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("bad data injected into lane %d of %d", h.bad.laneK, len(h.lanes)))
		}
	}

}

// verdict turns the figures into failures.
func (c *checker) verdict() {
	h, rep, obs, killed, inter := c.h, c.rep, c.obs, c.killed, c.inter
	// Verdict.
	if rep.Lost > 0 {
		c.fail("%d acknowledged tasks lost (neither ran nor are dead letters)", rep.Lost)
		rep.Details = append(rep.Details, h.describeLost(c.lost, obs)...)
	}
	if rep.EarlyBeyond > 0 {
		c.fail("%d runs started before their due time by more than %v (max %v)", rep.EarlyBeyond, c.bound, rep.MaxEarly)
	}
	if rep.DueMovedEarlier > 0 {
		c.fail("%d runs saw a due time earlier than the producer asked for", rep.DueMovedEarlier)
	}
	if rep.DupUnexplained > 0 {
		c.fail("%d tasks ran more often than interruptions explain", rep.DupUnexplained)
		for i, id := range c.unexplained {
			if i == 10 {
				rep.Details = append(rep.Details, fmt.Sprintf("... and %d more unexplained duplicates", len(c.unexplained)-10))
				break
			}
			rep.Details = append(rep.Details, h.describeRuns(id, obs, killed, inter[id]))
		}
	}
	if n := rep.BatchesPartial - rep.BatchesStuck; n > 0 {
		c.fail("%d unacknowledged batches ran in part, the rest of their tasks not in Redis (all-or-nothing broken)", n)
	}
	if rep.BatchesStuck > 0 {
		c.fail("%d unacknowledged batches ran in part: the rest of their tasks are in Redis but did not run (stuck)", rep.BatchesStuck)
	}
	if rep.WedgedSlots > 0 {
		c.fail("%d worker handler slots kept retrying to record a result that can never be recorded (record deleted or malformed): each slot is lost until its process stops", rep.WedgedSlots)
		for i, w := range c.wedged {
			if i == 8 {
				rep.Details = append(rep.Details, fmt.Sprintf("... and %d more wedged slots", len(c.wedged)-8))
				break
			}
			rep.Details = append(rep.Details, w)
		}
	}
	if len(rep.Crashes) > 0 {
		c.fail("%d processes exited unexpectedly", len(rep.Crashes))
	}
	if rep.Panics > 0 {
		c.fail("%d panics, fatal errors or data races in process logs", rep.Panics)
	}
	if rep.Violations > 0 {
		c.fail("%d commands not valid for Redis 2.4", rep.Violations)
	}
	for _, b := range rep.BadData {
		if !b.OK {
			c.fail("bad data %q: %s", b.Name, b.Observed)
		}
	}
	if rep.DeadLettered > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d acknowledged noop tasks were dead-lettered (counted apart from lost)", rep.DeadLettered))
	}
}

// scenarioChecks runs the checks of what the scenario is for: each a
// note, a failure, or a sign it was not exercised.
func (c *checker) scenarioChecks() {
	h, rep, obs := c.h, c.rep, c.obs
	// A scenario's own check: its note, or the failure it found.
	noted := func(note string, err error) {
		switch {
		case errors.Is(err, errNotExercised):
			rep.Unexercised = append(rep.Unexercised, err.Error())
		case err != nil:
			c.fail("%v", err)
		default:
			rep.Notes = append(rep.Notes, note)
		}
	}
	if h.sc.Groups {
		noted(obs.checkGroups())
	}
	if h.sc.Chained {
		noted(obs.checkChained())
	}
	if h.sc.Ahead {
		noted(obs.checkAhead())
	}
	if h.sc.Inline {
		noted(h.checkInline())
	}
	if h.sc.Snoozed {
		noted(h.checkSnoozed())
	}
	if h.sc.MaxRunning > 0 {
		noted(h.checkLimit(obs))
	}
	if h.sc.KeyMaxRunning > 0 {
		noted(h.checkKeyLimit(obs))
	}
	if h.sc.Rate != "" {
		noted(h.checkRate(obs, false))
	}
	if h.sc.KeyRate != "" {
		noted(h.checkRate(obs, true))
	}
	if h.sc.Expire > 0 {
		noted(c.checkExpiry())
	}
}

// noopSleepMax is chaosproc's -sleep-max default: the longest a noop
// handler waits.
const noopSleepMax = 20 * time.Millisecond

// sleepMax is the longest a noop handler of the scenario sleeps.
func (h *harness) sleepMax() time.Duration {
	if h.sc.SleepMax > 0 {
		return h.sc.SleepMax
	}
	return noopSleepMax
}

// checkLimit proves from the handler ledgers that no more runs overlapped
// at any instant than the queue limit allows (Scenario.MaxRunning, per
// lane), and that the limit was reached (overlap).
func (h *harness) checkLimit(obs *observed) (string, error) {
	bound := h.sc.MaxRunning * max(len(h.lanes), 1)
	var all []*ledger.Run
	for _, rs := range obs.runs {
		all = append(all, rs...)
	}
	o := h.overlap(all)
	if o.most > bound {
		return "", fmt.Errorf("queue limit %d (%d lanes): %d runs overlapped at %s", h.sc.MaxRunning, max(len(h.lanes), 1), o.most, fmtMs(o.at))
	}
	reach := h.sc.MaxRunning
	if h.sc.LimitReach > 0 {
		reach = h.sc.LimitReach
	}
	if o.most < reach {
		return "", fmt.Errorf("%w: at most %d runs overlapped, the limit is %d (%d must overlap)", errNotExercised, o.most, h.sc.MaxRunning, reach)
	}
	return fmt.Sprintf("queue limit %d (%d lanes): at most %d runs overlapped (first at %s), over %d runs (%d ended by a kill, %d without an end)",
		h.sc.MaxRunning, max(len(h.lanes), 1), o.most, fmtMs(o.at), len(all), o.killed, o.open), nil
}

// overlapped is what overlap found: the most runs at one instant, the
// first instant with that many, and the runs whose end was a kill or is
// not known.
type overlapped struct {
	most         int
	at           int64
	killed, open int
}

// overlap sweeps runs: each lasts from its S line to its E line; one
// without an E line ends when its process was killed (the first kill of
// its pid after its start), and never later than the noop handler's
// longest sleep after its start (chaosproc -sleep-max, the scenario's
// SleepMax), which the handler never waits past: a run with
// neither (its handler returned at its context's end) ends then.
func (h *harness) overlap(runs []*ledger.Run) overlapped {
	h.mu.Lock()
	kills := map[int][]time.Time{}
	for _, k := range h.kills {
		kills[k.PID] = append(kills[k.PID], k.At)
	}
	h.mu.Unlock()
	type ev struct {
		t     int64
		delta int
	}
	var evs []ev
	var o overlapped
	for _, r := range runs {
		end := r.End
		if end == 0 {
			for _, at := range kills[r.PID] {
				if ms := at.UnixMilli(); ms >= r.Start && (end == 0 || ms < end) {
					end = ms
				}
			}
			longest := r.Start + h.sleepMax().Milliseconds() + 1
			if end != 0 && end <= longest {
				o.killed++
			} else {
				o.open++
				end = longest
			}
		}
		evs = append(evs, ev{r.Start, 1}, ev{end, -1})
	}
	// An end and a start in the same millisecond: the end first (a slot
	// is given back before the claim that takes it).
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].delta < evs[j].delta
	})
	n := 0
	for _, e := range evs {
		n += e.delta
		if n > o.most {
			o.most, o.at = n, e.t
		}
	}
	return o
}

// checkSnoozed tells whether handlers snoozed tasks: the queues' snoozed
// counters, summed over the lanes, above zero.
func (h *harness) checkSnoozed() (string, error) {
	total := 0
	for _, l := range h.lanes {
		c := l.admin.Get()
		qs, err := redis.Strings(c.Do("SMEMBERS", l.keys.Queues()))
		for _, q := range qs {
			var n int
			if n, err = redis.Int(c.Do("HGET", l.keys.Stats(q), buckets.StatSnoozed)); errors.Is(err, redis.ErrNil) {
				err = nil
			}
			if err != nil {
				break
			}
			total += n
		}
		c.Close()
		if err != nil {
			return "", fmt.Errorf("snoozed counters: %w", err)
		}
	}
	if total == 0 {
		return "", fmt.Errorf("%w: no task was snoozed", errNotExercised)
	}
	return fmt.Sprintf("runs that snoozed their task (the queues' counters): %d", total), nil
}

// errNotExercised marks a scenario's check that found the run did not
// reach what the scenario is for (Report.Unexercised).
var errNotExercised = errors.New("not exercised")

// checkGroups tells whether producers' enqueue calls shared transactions:
// fewer EXECs than calls, by the producers' last G lines.
func (o *observed) checkGroups() (string, error) {
	if o.calls == 0 || o.execs >= o.calls {
		return "", fmt.Errorf("%w: producers made %d enqueue calls in %d EXECs, so no enqueues shared a transaction (group commit)", errNotExercised, o.calls, o.execs)
	}
	return fmt.Sprintf("producers' enqueue calls shared transactions: %d calls, %d EXECs (by the last count of each producer)", o.calls, o.execs), nil
}

// checkChained tells whether workers took batches in the round trip of
// the results before them, by the workers' last C lines.
func (o *observed) checkChained() (string, error) {
	if o.chained == 0 {
		return "", fmt.Errorf("%w: no worker took a batch in the round trip of the results before it", errNotExercised)
	}
	return fmt.Sprintf("workers took %d batches in the round trip of the results before them (by the last count of each worker)", o.chained), nil
}

// checkAhead tells whether workers claimed tasks ahead of their slots,
// by the workers' last P lines.
func (o *observed) checkAhead() (string, error) {
	if o.ahead == 0 {
		return "", fmt.Errorf("%w: no worker claimed a task ahead of its slots", errNotExercised)
	}
	return fmt.Sprintf("workers claimed %d tasks ahead of their slots (by the last count of each worker)", o.ahead), nil
}

// checkInline sums the inline guards of every lane: each removal of an
// inline entry (a move, a cancel) increments one, so a sum of zero means
// no inline entry was moved.
func (h *harness) checkInline() (string, error) {
	total := 0
	for _, l := range h.lanes {
		c := l.admin.Get()
		for g := range buckets.Guards {
			n, err := redis.Int(c.Do("GET", l.keys.Guard(g)))
			if err != nil && !errors.Is(err, redis.ErrNil) {
				c.Close()
				return "", fmt.Errorf("inline guard %d: %w", g, err)
			}
			total += n
		}
		c.Close()
	}
	if total == 0 {
		return "", fmt.Errorf("%w: no inline entry was moved", errNotExercised)
	}
	return fmt.Sprintf("inline entries removed from the index (the guards' total): %d", total), nil
}

// earlyBound is how early a task may start on its producer's clock: the
// furthest a dispatcher's clock runs ahead of a producer's.
func (h *harness) earlyBound() time.Duration {
	if !h.sc.Skew {
		return 0
	}
	maxD, minP := time.Duration(-1<<62), time.Duration(1<<62)
	for i := 0; i < h.sc.Dispatchers; i++ {
		maxD = max(maxD, h.offset(roleDispatcher, i))
	}
	for i := 0; i < h.sc.Producers; i++ {
		minP = min(minP, h.offset(roleProducer, i))
	}
	return max(0, maxD-minP)
}

func (h *harness) describeRuns(id string, obs *observed, killed map[int]*killEvent, in []interruption) string {
	var b strings.Builder
	fmt.Fprintf(&b, "task %s (payload %s) ran %d times:", id, obs.payload[id], len(obs.runs[id]))
	for _, r := range obs.runs[id] {
		fmt.Fprintf(&b, "\n    pid %d %s start %s end %s attempt %d recoveries %d",
			r.PID, filepath.Base(r.File), fmtMs(r.Start), fmtMs(r.End), r.Attempt, r.Recoveries)
		if k := killed[r.PID]; k != nil {
			fmt.Fprintf(&b, " (pid %s at %s)", sigName(k.Signal), k.At.Format("15:04:05.000"))
		}
	}
	for _, x := range in {
		fmt.Fprintf(&b, "\n    interruption: pid %d %s", x.pid, x.reason)
	}
	return b.String()
}

// describeLost says where lost tasks are, from the keys of the namespace
// (read now, after the processes stopped).
func (h *harness) describeLost(lost []string, obs *observed) []string {
	where := h.locate(lost)
	for id, w := range h.lostBeforeStop {
		where[id] = location{w.summary + ", before the processes stopped", w.detail}
	}
	groups := map[string]int{}
	var out []string
	for i, id := range lost {
		w := where[id]
		groups[w.summary]++
		if i < 10 {
			a := obs.acked[id]
			out = append(out, fmt.Sprintf("lost task %s (batch %s #%d, due %s): %s", id, a.Batch, a.Index, fmtMs(a.Due-a.Offset), w.detail))
		}
	}
	for _, g := range sortedKeys(groups) {
		out = append(out, fmt.Sprintf("lost tasks %s: %d", g, groups[g]))
	}
	return out
}

type location struct{ summary, detail string }

// locate finds where ids are: record state and every list or sorted set
// of the namespace that holds them.
func (h *harness) locate(ids []string) map[string]location {
	out := map[string]location{}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	found := map[string][]string{}
	for _, l := range h.lanes {
		c := l.admin.Get()
		var all []string
		for _, pat := range []string{"f:*", "p:*", "q:*", "b:*", "dead", "bad:*"} {
			ks, err := redis.Strings(c.Do("KEYS", l.keys.Prefix()+pat))
			if err != nil {
				c.Close()
				for _, id := range ids {
					out[id] = location{"(redis unreachable)", err.Error()}
				}
				return out
			}
			all = append(all, ks...)
		}
		for _, k := range all {
			typ, _ := redis.String(c.Do("TYPE", k))
			var members []string
			switch typ {
			case "list":
				members, _ = redis.Strings(c.Do("LRANGE", k, 0, -1))
			case "zset":
				members, _ = redis.Strings(c.Do("ZRANGE", k, 0, -1))
			default:
				continue
			}
			for _, m := range members {
				if want[m] {
					found[m] = append(found[m], strings.TrimPrefix(k, l.keys.Prefix()))
				}
			}
		}
		c.Close()
	}
	names := h.workerNames()
	for _, id := range ids {
		var state string
		l := h.laneOf(id)
		c := l.admin.Get()
		raw, err := redis.Bytes(c.Do("GET", l.keys.Task(id)))
		c.Close()
		switch {
		case err == redis.ErrNil:
			state = "no record"
		case err != nil:
			state = "record unreadable: " + err.Error()
		default:
			if r, derr := buckets.DecodeRecord(id, raw); derr != nil {
				state = "record malformed"
			} else {
				state = fmt.Sprintf("record %s, runs %d, recoveries %d", r.State, r.Runs, r.Recoveries)
				if r.Worker != "" {
					state += ", worker " + names.describe(r.Worker)
				}
			}
		}
		var places, kinds []string
		for _, k := range found[id] {
			kind, rest, _ := strings.Cut(k, ":")
			switch kind {
			case "f", "p":
				rest = names.describe(rest)
			}
			places = append(places, kind+":"+rest)
			kinds = append(kinds, map[string]string{"f": "in a worker's in-flight list", "p": "in a worker's pending set",
				"q": "in a ready list", "b": "in a bucket", "dead": "in the dead letters"}[kind])
		}
		if len(places) == 0 {
			places, kinds = []string{"in no list or set"}, []string{"in no list or set"}
		}
		sort.Strings(kinds)
		out[id] = location{summary: strings.Join(kinds, " + ") + " (" + strings.SplitN(state, ",", 2)[0] + ")",
			detail: state + "; " + strings.Join(places, ", ")}
	}
	return out
}

type workerNames map[string]*proc

func (h *harness) workerNames() workerNames {
	out := workerNames{}
	for _, p := range h.allProcs() {
		for _, id := range p.workerIDs() {
			out[id] = p
		}
	}
	return out
}

func (w workerNames) describe(id string) string {
	p := w[id]
	if p == nil {
		return id
	}
	how := "stopped at the end of the run"
	switch syscall.Signal(p.sig.Load()) {
	case syscall.SIGKILL:
		how = "killed"
	case syscall.SIGTERM:
		if !p.exited.IsZero() && p.exited.Before(time.Now().Add(-2*time.Second)) {
			how = "stopped (SIGTERM)"
		}
	}
	return fmt.Sprintf("%s (%s, pid %d, %s)", id[:8], p.Name, p.PID, how)
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

func fmtMs(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).Format("15:04:05.000")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// errClass shortens an error for grouping: its last part, without ids.
func errClass(e string) string {
	if i := strings.LastIndex(e, ": "); i >= 0 && len(e)-i > 3 {
		e = e[i+2:]
	}
	if len(e) > 60 {
		e = e[:60]
	}
	return e
}

// partialWhere is what became of the tasks of a batch that ran in part.
type partialWhere struct {
	allFound bool     // every missing task has a record in Redis
	lines    []string // one per missing task
}

// partialLocations finds the tasks of the batches that ran in part: their
// ids were never returned, so it reads every task record of the namespace
// and matches payloads.
func (h *harness) partialLocations(obs *observed) map[string]*partialWhere {
	want := map[string]string{} // payload word -> batch id
	for bid, got := range obs.batchRuns {
		b := obs.batches[bid]
		if b == nil || b.Acked || len(got) == b.N {
			continue
		}
		for i := 0; i < b.N; i++ {
			if !got[i] {
				want[fmt.Sprintf("batch:%s:%d", bid, i)] = bid
			}
		}
	}
	if len(want) == 0 {
		return nil
	}
	out := map[string]*partialWhere{}
	for _, bid := range want {
		out[bid] = &partialWhere{allFound: true}
	}
	ids := h.findByPayload(want)
	var found []string
	for _, id := range ids {
		found = append(found, id)
	}
	where := h.locate(found)
	for _, w := range sortedKeys(want) {
		pw := out[want[w]]
		id, ok := ids[w]
		if !ok {
			pw.allFound = false
			pw.lines = append(pw.lines, w+": no task record with this payload in Redis")
			continue
		}
		pw.lines = append(pw.lines, fmt.Sprintf("%s: task %s, %s", w, id, where[id].detail))
	}
	return out
}

// findByPayload maps payload words to the ids of the task records that
// hold them.
func (h *harness) findByPayload(words map[string]string) map[string]string {
	out := map[string]string{}
	for _, l := range h.lanes {
		h.findByPayloadIn(l, words, out)
	}
	return out
}

// findByPayloadIn is findByPayload in one lane.
func (h *harness) findByPayloadIn(l *lane, words, out map[string]string) {
	keys := l.keys
	c := l.admin.Get()
	defer c.Close()
	all, err := redis.Strings(c.Do("KEYS", keys.Task("*")))
	if err != nil {
		return
	}
	for len(all) > 0 {
		n := min(len(all), 500)
		args := make([]any, n)
		for i := range args {
			args[i] = all[i]
		}
		raws, err := redis.ByteSlices(c.Do("MGET", args...))
		if err != nil {
			return
		}
		for i, raw := range raws {
			id := strings.TrimPrefix(all[i], keys.Task(""))
			if r, err := buckets.DecodeRecord(id, raw); err == nil {
				if w := ledger.PayloadWord(r.Payload); words[w] != "" {
					out[w] = id
				}
			}
		}
		all = all[n:]
	}
}
