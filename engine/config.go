package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Config holds every setting of the engine's parts. The zero value of each
// field means the default written beside it; NewClient, NewDispatcher,
// NewWorker, NewReaper and NewServer fill the defaults and call Validate.
type Config struct {
	// Namespace prefixes every key, as "{Namespace}:". Default "bq".
	Namespace string
	// Resolution is the width of a bucket: due times are rounded up to a
	// multiple of it, so a task is late by at most about this much. 1 ms to
	// 60 s. Default 10 ms (docs/benchmarks.md says why).
	Resolution time.Duration
	// MaxPayload bounds a task's payload in bytes. Default 512 KiB.
	MaxPayload int
	// DefaultQueue is the queue of a task enqueued without Queue().
	// Default "default".
	DefaultQueue string
	// DefaultMaxAttempts is how many times a task may fail before it goes
	// to the dead letters, unless MaxAttempts() says otherwise. Default 25.
	DefaultMaxAttempts int
	// DefaultTimeout bounds one run of a handler unless Timeout() says
	// otherwise. Default 30 minutes.
	DefaultTimeout time.Duration

	// Queues the workers take tasks from, highest priority first when
	// StrictPriority is set. Default: DefaultQueue with weight 1.
	Queues []QueueConfig
	// StrictPriority takes from a queue only when every queue before it
	// is empty. Otherwise each queue gets a share of the fetches
	// proportional to its weight, and none starves.
	StrictPriority bool
	// Concurrency is how many handlers a worker process runs at once.
	// Default 10.
	Concurrency int
	// ClaimBatch caps how many tasks a worker process takes from a queue
	// in one round trip and claims in one transaction when the queue is
	// deep. The number adapts: one while the queue is shallow or one
	// handler slot is free, growing (doubling) up to this cap while every
	// pop finds a task and slots are free. 1 takes one task at a time.
	// 1 to 1000; default 32.
	ClaimBatch int
	// Prefetch is how many tasks a worker process may claim beyond
	// Concurrency, to wait in the process for a free handler slot (and
	// start in the order claimed), while the worker takes from one queue,
	// it is deep and its handlers are quick (see PrefetchWait): a
	// batch of quick tasks then takes up to ClaimBatch tasks in one claim
	// and one result transaction, not Concurrency. A task claimed ahead
	// is claimed: it waits in the pending set, under a lease, as a running
	// one does, so a crash recovers it as today; when the worker stops, or
	// when it waited half of LeaseGrace for a slot, it goes back to the
	// front of its queue at once, not counted as a recovery. 0: the
	// default, ClaimBatch minus Concurrency (none when Concurrency is at
	// least ClaimBatch); negative: never more than Concurrency. At most
	// 1000.
	Prefetch int
	// PrefetchWait is how long a task claimed ahead may expect to wait
	// for a slot: the worker claims ahead only while its handlers' recent
	// mean run time, times the tasks claimed ahead per slot, is within
	// it, and, while every slot is taken, one was freed within it (runs
	// stuck in long handlers do not count in the mean until they end),
	// so a worker does not sit on tasks that another could start, nor
	// delay a task of a higher-priority queue that arrives meanwhile, by
	// more than about this long. 0 to 1 s; default 5 ms.
	PrefetchWait time.Duration
	// GroupCommitWindow is how long the first of several results that
	// finish together may wait for others to share its transaction (and
	// round trip); a result never waits when no other handler of the
	// process is running, nor once GroupCommitMax results are waiting.
	// Results of tasks taken one at a time are recorded on their own.
	// Negative: every result in its own transaction. 0 to 100 ms;
	// default 1 ms.
	GroupCommitWindow time.Duration
	// GroupCommitMax caps the results one group transaction records.
	// 1 to 1000; default 64.
	GroupCommitMax int
	// EnqueueGroupMax caps the tasks that concurrent enqueues of one
	// Client share in one transaction (producer-side group commit): an
	// enqueue of tasks with generated ids and no unique key that arrives
	// while EnqueueGroupLanes of the Client's enqueues are in flight
	// waits for one to end and goes in the next transaction with the
	// others that arrived meanwhile. An enqueue never waits while fewer
	// are in flight. 1: every enqueue in its own transaction. 1 to
	// 10000; default 256.
	EnqueueGroupMax int
	// EnqueueGroupLanes is how many of one Client's enqueue transactions
	// may be in flight at once before further enqueues queue for group
	// commit: with more than one, the next group is built and sent while
	// the last one's round trip is still out, so many producers on one
	// Client enqueue faster, in more and smaller transactions, which
	// cost the server more CPU (on a loaded machine, scheduled tasks run
	// later). 1 to 64; default 1.
	EnqueueGroupLanes int
	// LeaseGrace is how long past its timeout a run may go before the
	// worker gives the task up for another to run (its handler is hung).
	// Default 30 s.
	LeaseGrace time.Duration
	// HeartbeatInterval is how often a worker proves it is alive; its
	// heartbeat key lives HeartbeatTTL (whole seconds, at least twice the
	// interval). Defaults 10 s and 30 s.
	HeartbeatInterval time.Duration
	HeartbeatTTL      time.Duration
	// IdleWait is the longest a blocked worker or dispatcher waits before
	// it looks again on its own, in whole seconds (Redis 2.4 blocking
	// timeouts are integers). New work wakes them at once; this only
	// bounds the cost of a lost wake-up. Default 20 s.
	IdleWait time.Duration
	// ShutdownTimeout is how long Run, when its context ends, or Shutdown
	// (whatever its context's deadline, if later) lets running handlers
	// finish before their contexts are cancelled and their tasks go back
	// to the queues; negative returns them at once. Default 30 s.
	ShutdownTimeout time.Duration
	// RetryDelay gives the wait before retry number attempt (1 for the
	// first retry) of task t, whose run just failed with err. t is the task
	// as its handler saw it. It is called on the worker's goroutine and
	// must not block; a negative delay means none. Default:
	// DefaultRetryDelay.
	RetryDelay func(t *Task, attempt int, err error) time.Duration
	// UnknownType says what happens to a task whose type has no handler:
	// UnknownRetry (default) treats it as a failure, so it is retried with
	// backoff and dies after its attempts; UnknownDead sends it to the dead
	// letters at once.
	UnknownType UnknownPolicy
	// UnknownTypeGrace is how long a task type may go unserved on a queue
	// before the UnknownType policy applies to its tasks. A worker whose
	// handler lists its types (a *Mux does) gives a task of another type
	// back at once, for a worker that serves it, without counting an
	// attempt; only when no live worker has served the type on the queue
	// for this long does it run the task into the policy. Negative: no
	// grace. Default 1 minute.
	UnknownTypeGrace time.Duration
	// MaxRecoveries is how many times a task may be recovered after its
	// worker died or its lease ran out before it goes to the dead letters;
	// negative allows none. Default 5.
	MaxRecoveries int
	// DoneRetention is how long a succeeded or cancelled task's record is
	// kept for Lookup; negative keeps none. Default 10 minutes.
	DoneRetention time.Duration
	// MaxResult bounds a result recorded with SetResult, in bytes.
	// Default 64 KiB.
	MaxResult int
	// ResultRetention is how long a done task's result is kept; negative
	// keeps none. Default: DoneRetention (when that keeps records).
	ResultRetention time.Duration
	// DeadRetention is how long dead letters are kept. Default 30 days.
	DeadRetention time.Duration

	// ReapInterval is how often a reaper looks for dead workers and
	// expired leases. Default 30 s.
	ReapInterval time.Duration
	// DispatchBuckets bounds the buckets one dispatcher transaction moves
	// (WATCH costs grow with the square of it at the server); DispatchTasks
	// bounds the tasks. Defaults 128 and 4096.
	DispatchBuckets int
	DispatchTasks   int
	// DispatchLanes is how many connections a dispatcher moves a backlog
	// on at once (disjoint buckets, so they never conflict). Default 2.
	DispatchLanes int

	// AllowEviction lets Server.Run start on a Redis whose
	// maxmemory-policy is allkeys-* with a limit set, which evicts task
	// records when memory is full: tasks can then be lost. Default false
	// (Run refuses with ErrEviction).
	AllowEviction bool

	// Logger receives the engine's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock tells the time. Default (nil): the system clock, time.Now.
	Clock Clock
	// Observer receives the engine's events (enqueues, dispatch rounds,
	// starts, results, retries, deaths, recoveries) after they happened,
	// for metrics and tracing. Default nil: none.
	Observer Observer

	// lane is the logical shard the parts built with this Config serve;
	// set only by the sharded constructors (shard.go).
	lane laneSpec
}

// QueueConfig names a queue a worker takes tasks from.
type QueueConfig struct {
	Name string
	// Weight is the queue's share under weighted priority (at least 1).
	Weight int
}

// UnknownPolicy is what workers do with a task whose type has no handler.
type UnknownPolicy int

// Unknown-type policies.
const (
	UnknownRetry UnknownPolicy = iota
	UnknownDead
)

// DefaultRetryDelay waits about 2^(attempt-1) seconds before retry number
// attempt, capped at one hour, drawn uniformly from the upper half of
// that (jitter keeps a burst of failures from retrying in step). It looks
// at neither the task nor the error.
func DefaultRetryDelay(_ *Task, attempt int, _ error) time.Duration {
	d := time.Second << min(max(attempt-1, 0), 12)
	if d > time.Hour {
		d = time.Hour
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// DefaultConfig returns a Config with every field set to its default, for
// tools that show or compare settings.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns a copy with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = "bq"
	}
	if c.Resolution == 0 {
		c.Resolution = 10 * time.Millisecond
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = 512 << 10
	}
	if c.DefaultQueue == "" {
		c.DefaultQueue = "default"
	}
	if c.DefaultMaxAttempts == 0 {
		c.DefaultMaxAttempts = 25
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 30 * time.Minute
	}
	if len(c.Queues) == 0 {
		c.Queues = []QueueConfig{{Name: c.DefaultQueue, Weight: 1}}
	} else {
		qs := make([]QueueConfig, len(c.Queues))
		copy(qs, c.Queues)
		for i := range qs {
			if qs[i].Weight == 0 {
				qs[i].Weight = 1
			}
		}
		c.Queues = qs
	}
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	if c.ClaimBatch == 0 {
		c.ClaimBatch = 32
	}
	if c.PrefetchWait == 0 {
		c.PrefetchWait = 5 * time.Millisecond
	}
	if c.GroupCommitWindow == 0 {
		c.GroupCommitWindow = time.Millisecond
	}
	if c.GroupCommitMax == 0 {
		c.GroupCommitMax = 64
	}
	if c.EnqueueGroupMax == 0 {
		c.EnqueueGroupMax = 256
	}
	if c.EnqueueGroupLanes == 0 {
		c.EnqueueGroupLanes = 1
	}
	if c.LeaseGrace == 0 {
		c.LeaseGrace = 30 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.HeartbeatTTL == 0 {
		c.HeartbeatTTL = max(30*time.Second, 3*c.HeartbeatInterval)
	}
	if c.IdleWait == 0 {
		c.IdleWait = 20 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.RetryDelay == nil {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.UnknownTypeGrace == 0 {
		c.UnknownTypeGrace = time.Minute
	}
	if c.MaxRecoveries == 0 {
		c.MaxRecoveries = 5
	}
	if c.DoneRetention == 0 {
		c.DoneRetention = 10 * time.Minute
	}
	if c.MaxResult == 0 {
		c.MaxResult = 64 << 10
	}
	if c.ResultRetention == 0 {
		c.ResultRetention = c.DoneRetention
	}
	if c.DeadRetention == 0 {
		c.DeadRetention = 30 * 24 * time.Hour
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 30 * time.Second
	}
	if c.DispatchBuckets == 0 {
		c.DispatchBuckets = 128
	}
	if c.DispatchLanes == 0 {
		c.DispatchLanes = 2
	}
	if c.DispatchTasks == 0 {
		c.DispatchTasks = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c
}

// ConfigError is a Config setting that Validate refuses. It matches
// ErrInvalidOption with errors.Is.
type ConfigError struct {
	// Field names the setting as written in Go: "Concurrency",
	// "Queues[1].Weight".
	Field string
	// Msg says what is wrong with its value and what is wanted.
	Msg string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("engine: config %s: %s: %v", e.Field, e.Msg, ErrInvalidOption)
}

// Unwrap returns ErrInvalidOption.
func (e *ConfigError) Unwrap() error { return ErrInvalidOption }

// Validate reports every setting that is out of range, each as a
// *ConfigError: one alone, several joined with errors.Join (errors.As
// finds the first). Zero values are valid: they mean the defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	refused := map[string]bool{} // one error a field: the first check it fails
	bad := func(field, format string, args ...any) {
		if !refused[field] {
			refused[field] = true
			errs = append(errs, &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)})
		}
	}
	if !buckets.ValidName(c.Namespace) {
		bad("Namespace", "%q: want 1-64 of A-Z a-z 0-9 _ . -", c.Namespace)
	}
	if c.Resolution < time.Millisecond || c.Resolution > time.Minute || c.Resolution%time.Millisecond != 0 {
		bad("Resolution", "%v: want whole milliseconds from 1ms to 60s", c.Resolution)
	}
	if c.MaxResult < 0 || c.MaxResult > 512<<20 {
		bad("MaxResult", "%d: want 1 byte to 512 MiB", c.MaxResult)
	}
	if c.MaxPayload < 0 || c.MaxPayload > 512<<20 {
		bad("MaxPayload", "%d: want 1 byte to 512 MiB", c.MaxPayload)
	}
	if !buckets.ValidName(c.DefaultQueue) {
		bad("DefaultQueue", "%q: want 1-64 of A-Z a-z 0-9 _ . -", c.DefaultQueue)
	}
	if c.DefaultMaxAttempts < 1 {
		bad("DefaultMaxAttempts", "%d: want at least 1", c.DefaultMaxAttempts)
	}
	if c.DefaultTimeout < time.Millisecond {
		bad("DefaultTimeout", "%v: want at least 1ms", c.DefaultTimeout)
	}
	seen := map[string]bool{}
	for i, q := range c.Queues {
		if !buckets.ValidName(q.Name) {
			bad(fmt.Sprintf("Queues[%d].Name", i), "%q: want 1-64 of A-Z a-z 0-9 _ . -", q.Name)
		}
		if seen[q.Name] {
			bad(fmt.Sprintf("Queues[%d].Name", i), "%q listed twice", q.Name)
		}
		seen[q.Name] = true
		if q.Weight < 1 {
			bad(fmt.Sprintf("Queues[%d].Weight", i), "%d: want at least 1", q.Weight)
		}
	}
	if c.Concurrency < 1 {
		bad("Concurrency", "%d: want at least 1", c.Concurrency)
	}
	if c.ClaimBatch < 1 || c.ClaimBatch > 1000 {
		bad("ClaimBatch", "%d: want 1 to 1000", c.ClaimBatch)
	}
	if c.Prefetch > 1000 {
		bad("Prefetch", "%d: want at most 1000 (negative: none)", c.Prefetch)
	}
	if c.PrefetchWait < 0 || c.PrefetchWait > time.Second {
		bad("PrefetchWait", "%v: want 0 to 1s", c.PrefetchWait)
	}
	if c.GroupCommitWindow > 100*time.Millisecond {
		bad("GroupCommitWindow", "%v: want at most 100ms (negative: no group commit)", c.GroupCommitWindow)
	}
	if c.GroupCommitMax < 1 || c.GroupCommitMax > 1000 {
		bad("GroupCommitMax", "%d: want 1 to 1000", c.GroupCommitMax)
	}
	if c.EnqueueGroupMax < 1 || c.EnqueueGroupMax > 10000 {
		bad("EnqueueGroupMax", "%d: want 1 to 10000", c.EnqueueGroupMax)
	}
	if c.EnqueueGroupLanes < 1 || c.EnqueueGroupLanes > 64 {
		bad("EnqueueGroupLanes", "%d: want 1 to 64", c.EnqueueGroupLanes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{
		{"LeaseGrace", c.LeaseGrace, time.Millisecond},
		{"HeartbeatInterval", c.HeartbeatInterval, 10 * time.Millisecond},
		{"HeartbeatTTL", c.HeartbeatTTL, time.Second},
		{"IdleWait", c.IdleWait, time.Second},
		{"ReapInterval", c.ReapInterval, 10 * time.Millisecond},
		{"DeadRetention", c.DeadRetention, time.Second},
	} {
		if d.v < d.min {
			bad(d.name, "%v: want at least %v", d.v, d.min)
		}
	}
	if c.HeartbeatTTL%time.Second != 0 {
		bad("HeartbeatTTL", "%v: want whole seconds (Redis 2.4 TTLs are seconds)", c.HeartbeatTTL)
	}
	if c.IdleWait%time.Second != 0 {
		bad("IdleWait", "%v: want whole seconds (Redis 2.4 blocking timeouts are integers)", c.IdleWait)
	}
	if c.HeartbeatTTL < 2*c.HeartbeatInterval {
		bad("HeartbeatTTL", "%v: want at least twice HeartbeatInterval (%v)", c.HeartbeatTTL, c.HeartbeatInterval)
	}
	if c.UnknownType != UnknownRetry && c.UnknownType != UnknownDead {
		bad("UnknownType", "%d: want UnknownRetry or UnknownDead", c.UnknownType)
	}
	if c.DispatchBuckets < 1 || c.DispatchBuckets > 10000 {
		bad("DispatchBuckets", "%d: want 1 to 10000", c.DispatchBuckets)
	}
	if c.DispatchLanes < 1 || c.DispatchLanes > 16 {
		bad("DispatchLanes", "%d: want 1 to 16", c.DispatchLanes)
	}
	if c.DispatchTasks < 1 || c.DispatchTasks > 100000 {
		bad("DispatchTasks", "%d: want 1 to 100000", c.DispatchTasks)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// prepare fills defaults, validates, and builds the store; with a pool,
// the store's repairs try again on its fresh connections
// (buckets.Store.Redial).
func (c Config) prepare(pool *redis.Pool) (Config, *buckets.Store, error) {
	if err := c.Validate(); err != nil {
		return c, nil, err
	}
	c = c.withDefaults()
	st, err := buckets.NewLaneStore(c.Namespace, c.lane.index, c.Resolution.Milliseconds())
	if err != nil {
		return c, nil, fmt.Errorf("engine: %w", err)
	}
	if c.lane.mapVersion > 0 {
		st.SetMapFence(c.lane.mapVersion)
	}
	log := c.Logger
	st.OnSetAside = func(key, movedTo string) {
		log.Error("key of the wrong type set aside; the tasks a write could not place were placed again", "key", key, "moved_to", movedTo)
	}
	st.OnPlacedAgain = func(tasks int) {
		log.Warn("tasks whose placement failed on a key of the wrong type placed again", "tasks", tasks)
	}
	if pool != nil {
		st.Redial = pool.GetContext
	}
	st.FlowTTL = c.doneTTL()
	if c.ResultRetention > 0 {
		st.ResultTTL = max(1, int64((c.ResultRetention+time.Second-1)/time.Second))
	}
	return c, st, nil
}

func (c Config) maxRecoveries() int { return max(c.MaxRecoveries, 0) }

func (c Config) unservedGraceMs() int64 { return max(c.UnknownTypeGrace.Milliseconds(), 0) }

func (c Config) doneTTL() int64 {
	if c.DoneRetention < 0 {
		return 0
	}
	return max(1, int64(c.DoneRetention/time.Second))
}

// prefetch is how many tasks a worker may claim beyond Concurrency.
func (c Config) prefetch() int {
	if c.Prefetch == 0 {
		return max(c.ClaimBatch-c.Concurrency, 0)
	}
	return max(c.Prefetch, 0)
}
