package chaos

import (
	"fmt"
	"strings"
	"time"
)

// Scenario is one kind of fault injection. Intervals are means: each gap
// is drawn from the run's seeded source.
type Scenario struct {
	Name string
	Doc  string

	Producers, Dispatchers, Reapers, Workers int
	Concurrency                              int

	KillWorkers   time.Duration // mean gap between worker kills; 0: none
	TermWorkers   float64       // share of worker kills that are SIGTERM (graceful) instead of SIGKILL
	KillInfra     time.Duration // mean gap between dispatcher/reaper kills
	KillProducers time.Duration // mean gap between producer kills
	// ProducerSelfKill is the chance per batch that a producer arms a
	// SIGKILL of itself 0-3 ms after the call starts: in the middle of
	// EnqueueBatch, or just after it returned.
	ProducerSelfKill float64

	Cuts          *CutPolicy // connections go through the cutting proxy
	ServerTimeout int        // redis-server "timeout" (s): idle connections closed

	Restarts time.Duration // mean gap between redis-server restarts (AOF, fsync always)

	// Full is the mean gap between the times the harness fills the
	// server: it sets maxmemory just below the memory in use for
	// FullFor, so that every write is refused (and, under a volatile
	// policy, keys with a TTL are evicted), then lifts it. The refusals
	// must be seen in the processes' logs, or the scenario did not
	// exercise them.
	Full time.Duration
	// Policy, when set, is the maxmemory-policy the server runs out of
	// memory under (Full), instead of its own default.
	Policy string

	Skew bool // processes run with clocks offset by -2 s, 0 or +2 s

	// BadData injects corrupted and hand-edited data: 1 records, ids,
	// types, payloads and bucket keys; 2 also a ready list and a
	// wake-up list of the wrong type, for a few seconds each.
	BadData int

	BatchMax int // largest producer batch
	Pad      int // payload padding, bytes

	// ProcArgs are extra chaosproc flags of every process.
	ProcArgs []string
	// SleepMax is the longest a noop handler sleeps (chaosproc
	// -sleep-max); 0 is chaosproc's default, noopSleepMax.
	SleepMax time.Duration

	// Turn: dispatchers must be seen holding the dispatch turn (the
	// harness samples it), or the scenario did not exercise it; seeing
	// it held, the harness kills every dispatcher (harness.watchTurn).
	Turn bool
	// Groups: producers must be seen sharing enqueue transactions (group
	// commit): over the producers' G lines, fewer EXECs than calls.
	Groups bool
	// Chained: workers must be seen taking a batch in the round trip of
	// the results before it: over the workers' C lines, a count above 0.
	Chained bool
	// Ahead: workers must be seen claiming tasks ahead of their slots
	// (engine Config.Advanced.Prefetch): over the workers' P lines, a count above 0.
	Ahead bool
	// Inline: inline entries must be seen moved (the guards' counters,
	// which every removal of an entry increments, above zero at the end),
	// or the scenario did not exercise them (harness.checkInline).
	Inline bool
	// Snoozed: handlers snooze tasks (chaosproc -snooze), which must be
	// seen in the queues' snoozed counters at the end.
	Snoozed bool
	// MaxRunning, when above 0, is the concurrency limit of the workers'
	// queues (chaosproc -max-running): the handler ledgers must show no
	// instant with more runs than that (per lane: times the lanes with
	// shards), and some instant with that many (harness.checkLimit), or
	// with LimitReach when set: where workers claim ahead, a task claimed
	// ahead holds a slot without running, so the runs the ledgers see at
	// once may fall short of the limit while every slot is taken.
	MaxRunning, LimitReach int
	// KeyMaxRunning, Rate and KeyRate are the rest of the workers'
	// queues' flow control (chaosproc -key-max-running, -queue-rate,
	// -key-rate): the handler ledgers must show no instant with more runs
	// of one key than KeyMaxRunning, and no window of a rate's period
	// with more claims (of the queue, of one key) than its N, and each
	// reached (harness.checkKeyLimit, checkRate).
	KeyMaxRunning int
	Rate, KeyRate string
	// RateShare, when above 0, sets Rate to that share of the pace the
	// run produces tasks at (per second), and KeyRate to half of Rate, so
	// that the windows bind in a run of any size.
	RateShare float64
	// Keys gives each task one of that many keys (chaosproc -keys).
	Keys int
	// Expire is the share of tasks that expire up to a second after
	// their due time (chaosproc -expire): none may start after it, and
	// every dead letter must be such a task, unstarted (checkExpiry).
	Expire float64

	// SlotArgs are extra chaosproc flags of single processes, by
	// "role-index" (e.g. "worker-0").
	SlotArgs map[string][]string

	// MinDrain is the shortest wait for the last tasks after the faults
	// stop (Options.Drain): a scenario whose rates hold a backlog back
	// drains at their pace.
	MinDrain time.Duration

	// MinDuration is the shortest default production time (the bad-data
	// windows need a steady load around them).
	MinDuration time.Duration
}

// Skew is the clock offset of the skew scenarios.
const Skew = 2 * time.Second

var scenarios = []Scenario{
	{
		Name: "workers", Doc: "kill -9 workers at random moments (some SIGTERM), restarting them",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 4, Concurrency: 8,
		KillWorkers: 700 * time.Millisecond, TermWorkers: 0.15, BatchMax: 20,
	},
	{
		Name: "infra", Doc: "kill -9 dispatchers and reapers mid-flight, 3 of each running (and some workers, so reapers have work)",
		Producers: 3, Dispatchers: 3, Reapers: 3, Workers: 3, Concurrency: 8,
		KillInfra: 300 * time.Millisecond, KillWorkers: 2 * time.Second, BatchMax: 20,
	},
	{
		Name: "producers", Doc: "kill -9 producers mid-EnqueueBatch (large batches); batches must be all or nothing",
		Producers: 4, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8,
		KillProducers: time.Second, ProducerSelfKill: 0.3, BatchMax: 200, Pad: 2000,
	},
	{
		Name: "turns", Doc: "four dispatchers over one-second buckets moved in parts (4 tasks a transaction), so that they take the dispatch turn; whenever the turn is seen held, kill -9 every dispatcher (the holder among them; at most every 4 s) and restart them",
		Producers: 3, Dispatchers: 4, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 50,
		ProcArgs: []string{"-resolution=1s", "-dispatch-tasks=4"},
		Turn:     true,
	},
	{
		Name: "groups", Doc: "producers enqueue one task a call from 16 goroutines on one client each, so that enqueues share group-commit transactions, two in flight at once; a proxy cuts connections around EXEC (a group's reply lost) and producers are killed (kill -9, some by themselves mid-call)",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 1,
		ProcArgs:      []string{"-producer-goroutines=16", "-enqueue-lanes=2"},
		KillProducers: 1500 * time.Millisecond, ProducerSelfKill: 0.005,
		Cuts:   &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02},
		Groups: true,
	},
	{
		Name: "inline", Doc: "producers enqueue one task a call, 80% delayed, so most delayed tasks are scheduled as inline entries; dispatchers and reapers are killed mid-flight (3 of each), workers too, and a proxy cuts connections around EXEC (a move's reply lost: settled)",
		Producers: 3, Dispatchers: 3, Reapers: 3, Workers: 3, Concurrency: 8, BatchMax: 1,
		ProcArgs:  []string{"-immediate=0.2"},
		KillInfra: 400 * time.Millisecond, KillWorkers: 1500 * time.Millisecond,
		Cuts:   &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02},
		Inline: true,
	},
	{
		Name: "snooze", Doc: "handlers snooze a third of the runs (up to twice a task, 0-20 ms) and report progress on every run; workers are killed (kill -9, some SIGTERM) and a proxy cuts connections around EXEC (a snooze's reply lost)",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		ProcArgs:    []string{"-snooze=0.3"},
		KillWorkers: time.Second, TermWorkers: 0.15,
		Cuts:    &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02},
		Snoozed: true,
	},
	{
		Name: "chained", Doc: "every task due at once, in batches of up to 100, and handlers that return at once, so that the worker's batch of every slot (two) takes the next batch in the round trip of its results; workers are killed (kill -9, some SIGTERM) and a proxy cuts connections around EXEC and after RPOPLPUSH (a group's results and the next batch's pops lost together)",
		// One worker of two slots: a batch of every slot is reached soon
		// after each burst of tasks, and the ready list grows deep while
		// the worker is down, on three shards too (each lane a third of
		// the tasks).
		//
		// Without claiming ahead (-prefetch=-1): a batch of every slot is
		// then two tasks. With it the batch's tokens are 32, and handlers
		// that write the ledger seldom end all 32 within one group's
		// window, which chaining needs (scenario prefetch exercises that).
		Producers: 3, Dispatchers: 1, Reapers: 2, Workers: 1, Concurrency: 2, BatchMax: 100,
		ProcArgs:    []string{"-immediate=1", "-sleep-max=0s", "-prefetch=-1"},
		KillWorkers: 900 * time.Millisecond, TermWorkers: 0.15,
		Cuts:    &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02, PopAfter: 0.01},
		Chained: true,
	},
	{
		Name: "prefetch", Doc: "every task due at once, in batches of up to 100, and handlers that return at once, so that workers of two slots claim up to 32 tasks and the rest wait in the process for a slot (claiming ahead); workers are killed (kill -9 with tasks claimed ahead, a third SIGTERM, which gives them back unstarted) and a proxy cuts connections around EXEC and after RPOPLPUSH",
		Producers: 3, Dispatchers: 1, Reapers: 2, Workers: 2, Concurrency: 2, BatchMax: 100,
		ProcArgs:    []string{"-immediate=1", "-sleep-max=0s"},
		KillWorkers: 700 * time.Millisecond, TermWorkers: 0.33,
		Cuts:  &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02, PopAfter: 0.01},
		Ahead: true,
	},
	{
		Name: "flow", Doc: "flow control under every fault: one queue limited to 3 running tasks and to starts in any second at 3/4 of the pace tasks are produced, each of 3 keys (one with half the tasks) to 1 running task and half the queue's starts, a fifth of the tasks expiring up to 1 s after their due time; 4 workers of 8 slots are killed (kill -9 holding slots, some SIGTERM), a proxy cuts connections around EXEC and after RPOPLPUSH, redis-server is restarted and runs out of memory (noeviction); no limit may be exceeded at any instant or in any window, and each must be reached; no task may start after its expiry",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 4, Concurrency: 8, BatchMax: 20,
		ProcArgs:    []string{"-immediate=0.7"},
		KillWorkers: 900 * time.Millisecond, TermWorkers: 0.15,
		Cuts:     &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02, PopAfter: 0.01},
		Restarts: 4 * time.Second, Full: time.Second,
		// The limits are exact when a full Redis refuses writes; under
		// 2.4's default volatile-lru an evicted heartbeat returns running
		// tasks early (docs/flow-control.md).
		Policy:     "noeviction",
		MaxRunning: 3, RateShare: 0.75, KeyMaxRunning: 1, Keys: 3, Expire: 0.2,
		// Runs long enough that the three keys' runs meet at the queue's
		// limit however the machine paces claims (with 20 ms runs a
		// loaded machine spread them out so none met); the rates, not
		// the runs, still bound the pace.
		SleepMax: 150 * time.Millisecond,
		// Tasks come a little faster than the rate lets them start, so
		// that the windows fill and a backlog waits, drained at the
		// rates' pace.
		MinDuration: 25 * time.Second, MinDrain: time.Minute,
	},
	{
		Name: "limit-ahead", Doc: "a queue whose flow control is a concurrency limit alone (32), claimed in batches whose slots are taken and given back in coalesced counts: worker-0 runs 40 handlers of up to 250 ms and claims nothing ahead, so the limit binds in a burst; workers 1 to 3 run 2 handlers that return at once and claim ahead (prefetch 4) while their last claim left 6 slots free; workers are killed (kill -9 holding slots and tasks claimed ahead, some SIGTERM), a proxy cuts connections around EXEC and after RPOPLPUSH, and redis-server is restarted; no more runs than the limit may overlap, and at least 24 must (a task claimed ahead holds a slot without running)",
		Producers: 3, Dispatchers: 1, Reapers: 2, Workers: 4, Concurrency: 8, BatchMax: 100,
		ProcArgs:    []string{"-immediate=1"},
		KillWorkers: 900 * time.Millisecond, TermWorkers: 0.15,
		Cuts:     &CutPolicy{ExecBefore: 0.01, ExecAfter: 0.02, PopAfter: 0.01},
		Restarts: 4 * time.Second,
		SlotArgs: map[string][]string{
			"worker-0": {"-concurrency=40", "-prefetch=-1", "-sleep-max=250ms"},
			"worker-1": {"-concurrency=2", "-prefetch=4", "-sleep-max=0s"},
			"worker-2": {"-concurrency=2", "-prefetch=4", "-sleep-max=0s"},
			"worker-3": {"-concurrency=2", "-prefetch=4", "-sleep-max=0s"},
		},
		MaxRunning: 32, LimitReach: 24, Ahead: true,
	},
	{
		Name: "conncut", Doc: "a proxy cuts connections (before/after EXEC, after RPOPLPUSH, during BLPOP, at random) and the server closes idle ones (timeout 1); worker 0 keeps no done records",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		Cuts: &CutPolicy{Before: 0.002, After: 0.002, ExecBefore: 0.01, ExecAfter: 0.02,
			PopAfter: 0.01, Blocked: 0.1, RandomEvery: 200 * time.Millisecond},
		ServerTimeout: 1,
		// One worker keeps no done records (DoneRetention < 0): a
		// result whose EXEC reply is lost finds no record on retry.
		SlotArgs: map[string][]string{"worker-0": {"-done-retention=-1s"}},
	},
	{
		Name: "restart", Doc: "stop (SIGTERM) or crash (SIGKILL) redis-server under load and restart it; appendonly yes, appendfsync always",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		Restarts: 2500 * time.Millisecond,
	},
	{
		Name: "skew", Doc: "process clocks offset by -2 s, 0 or +2 s (clocktest.Offset)",
		Producers: 3, Dispatchers: 3, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		Skew: true,
	},
	{
		Name: "baddata", Doc: "corrupted records, unknown types, payloads at and over the limit, records deleted under their ids, garbage ids and index members, keys of the wrong type",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		BadData: 2, MinDuration: 10 * time.Second,
	},
	{
		Name: "baddata-cuts", Doc: "bad data (records of the wrong type, corrupted and deleted records, wrong-type lists) while a proxy cuts connections: a bad id must not hold a worker or its recovery of lost pops",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		Cuts: &CutPolicy{Before: 0.002, After: 0.002, ExecBefore: 0.01, ExecAfter: 0.02,
			PopAfter: 0.02, Blocked: 0.1, RandomEvery: 200 * time.Millisecond},
		ServerTimeout: 1, BadData: 2, MinDuration: 10 * time.Second,
	},
	{
		Name: "kills-restarts", Doc: "kill -9 workers (some SIGTERM) while redis-server is stopped or crashed and restarted",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 4, Concurrency: 8, BatchMax: 20,
		KillWorkers: 700 * time.Millisecond, TermWorkers: 0.15, Restarts: 2500 * time.Millisecond,
	},
	{
		Name: "full", Doc: "the server runs out of memory every 250 ms for 150 ms (maxmemory set just below what is used, the server's own policy: noeviction on Redis 7, volatile-lru on 2.4) while tasks are enqueued, moved, run and retried; writes are refused, transactions must be all or nothing, and everything resumes by itself",
		Producers: 3, Dispatchers: 2, Reapers: 2, Workers: 3, Concurrency: 8, BatchMax: 20,
		Full: 250 * time.Millisecond,
	},
	{
		Name: "combined", Doc: "all of the above at once (bad data without the wrong-type ready and wake-up lists)",
		Producers: 3, Dispatchers: 3, Reapers: 3, Workers: 4, Concurrency: 8, BatchMax: 50, Pad: 200,
		KillWorkers: 1500 * time.Millisecond, TermWorkers: 0.15, KillInfra: time.Second, KillProducers: 1500 * time.Millisecond, ProducerSelfKill: 0.05,
		Cuts: &CutPolicy{Before: 0.001, After: 0.001, ExecBefore: 0.005, ExecAfter: 0.01,
			PopAfter: 0.005, Blocked: 0.05, RandomEvery: 500 * time.Millisecond},
		ServerTimeout: 1, Restarts: 5 * time.Second, Skew: true, BadData: 1,
	},
}

// Scenarios returns the names of the scenarios, in order.
func Scenarios() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.Name
	}
	return out
}

// LookupScenario returns the named scenario.
func LookupScenario(name string) (Scenario, error) {
	for _, s := range scenarios {
		if s.Name == name {
			return s, nil
		}
	}
	return Scenario{}, fmt.Errorf("chaos: unknown scenario %q (have %s)", name, strings.Join(Scenarios(), ", "))
}

// Describe lists the scenarios with their descriptions.
func Describe() string {
	var b strings.Builder
	for _, s := range scenarios {
		fmt.Fprintf(&b, "  %-10s %s\n", s.Name, s.Doc)
	}
	return b.String()
}
