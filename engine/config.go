package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
	"github.com/jonboulle/clockwork"
)

// Config holds every setting of the engine's parts. The zero value of each
// field means the default written beside it; the constructors fill the
// defaults and call Validate. What most programs set is at the top level;
// Advanced holds the tuning knobs, whose defaults suit almost every use.
type Config struct {
	// Namespace prefixes every key, as "{Namespace}:". Default "bq".
	Namespace string
	// Queues the workers take tasks from. Default: DefaultQueue, weight 1.
	Queues []QueueConfig
	// StrictPriority takes from a queue only when every queue before it
	// is empty; otherwise each queue gets a share of the fetches
	// proportional to its weight, and none starves. Default false.
	StrictPriority bool
	// DefaultQueue is the queue of a task enqueued without Queue().
	// Default "default".
	DefaultQueue string
	// Concurrency is how many handlers a worker process runs at once.
	// Default 10.
	Concurrency int

	// DefaultMaxAttempts is how many times a task may fail before it goes
	// to the dead letters, unless MaxAttempts() says otherwise. Default 25.
	DefaultMaxAttempts int
	// DefaultTimeout bounds one run of a handler unless Timeout() says
	// otherwise. Default 30 minutes.
	DefaultTimeout time.Duration
	// RetryDelay gives the wait before retry number attempt (1 for the
	// first) of task t, whose run failed with err. It must not block;
	// negative means none. Default DefaultRetryDelay.
	RetryDelay func(t *Task, attempt int, err error) time.Duration
	// UnknownType says what happens to a task no live worker has a
	// handler for (after Advanced.UnknownTypeGrace): "retry" (or "", the
	// default) fails it, with retries; "dead" buries it at once.
	UnknownType string
	// ShutdownTimeout is how long handlers may finish when Run's context
	// ends or Shutdown is called, before their tasks go back to their
	// queues; negative returns them at once. Default 30 s.
	ShutdownTimeout time.Duration

	// MaxPayload bounds a task's payload in bytes. Default 512 KiB.
	MaxPayload int
	// MaxResult bounds a result recorded with SetResult, in bytes.
	// Default 64 KiB.
	MaxResult int
	// DoneRetention is how long a succeeded or cancelled task's record is
	// kept for Lookup; negative keeps none. Default 10 minutes.
	DoneRetention time.Duration
	// ResultRetention is how long a done task's result is kept; negative
	// keeps none. Default DoneRetention.
	ResultRetention time.Duration
	// DeadRetention is how long dead letters are kept. Default 30 days.
	DeadRetention time.Duration

	// AllowEviction lets Server.Run start on a Redis whose
	// maxmemory-policy evicts any key (allkeys-*) with a limit set, where
	// tasks can be lost. Default false: Run refuses with ErrEviction.
	AllowEviction bool
	// Logger receives the engine's logs. Default slog.Default().
	Logger *slog.Logger
	// Observer receives the engine's events (enqueues, dispatch rounds,
	// starts, results, retries, deaths, recoveries), for metrics and
	// tracing. Default none.
	Observer Observer

	// Advanced holds the tuning knobs (docs/operations.md, "Tuning").
	Advanced AdvancedConfig

	// lane is the logical shard the parts built with this Config serve;
	// set only by the sharded constructors (shard.go).
	lane laneSpec
}

// AdvancedConfig holds the settings that tune the engine's work; the
// zero value of each means its default, which suits almost every use.
type AdvancedConfig struct {
	// Resolution is the width of a bucket: due times are rounded up to a
	// multiple of it, so a task runs at most about this late. 1 ms to
	// 60 s; default 10 ms.
	Resolution time.Duration
	// IdleWait is the longest a blocked worker or dispatcher waits before
	// looking again on its own, in whole seconds; new work wakes them at
	// once, so it only bounds the cost of a lost wake-up. Default 20 s.
	IdleWait time.Duration
	// LeaseGrace is how long past its timeout a run may go before the
	// worker gives its task up for another to run. Default 30 s.
	LeaseGrace time.Duration
	// HeartbeatInterval is how often a worker proves it is alive; its
	// heartbeat lives HeartbeatTTL (whole seconds, at least twice the
	// interval), after which a reaper recovers its tasks. Defaults 10 s
	// and 30 s.
	HeartbeatInterval time.Duration
	HeartbeatTTL      time.Duration
	// ReapInterval is how often a reaper looks for dead workers and
	// expired leases. Default 30 s.
	ReapInterval time.Duration
	// MaxRecoveries is how many times a task may be recovered (its worker
	// died or its lease ran out) before it is buried; negative allows
	// none. Default 5.
	MaxRecoveries int
	// MaxSnoozes is how many times a task's handler may snooze it
	// (Snooze) before it is buried with the reason "snoozed too often";
	// negative allows none. Default 1000.
	MaxSnoozes int
	// UnknownTypeGrace is how long a task type may go unserved on a queue
	// before Config.UnknownType applies; until then a worker without its
	// handler gives it back for one that has it. Negative: none. Default
	// 1 minute.
	UnknownTypeGrace time.Duration

	// ClaimBatch caps the tasks a worker takes and claims in one round
	// trip from a deep queue; the batch adapts below it (one while the
	// queue is shallow). 1 to 1000; default 32.
	ClaimBatch int
	// Prefetch is how many tasks a worker may claim beyond Concurrency,
	// to wait in the process for a slot while its queue is deep and its
	// handlers quick (PrefetchWait); they stay leased, and go back to the
	// front of their queue when the worker stops or after half of
	// LeaseGrace. A queue with flow control is claimed ahead only while
	// its max_running is far from binding (docs/flow-control.md). 0:
	// ClaimBatch minus Concurrency; negative: none. At most 1000.
	Prefetch int
	// PrefetchWait is how long a task claimed ahead may expect to wait
	// for a slot, judged from the handlers' recent run times. 0 to 1 s;
	// default 5 ms.
	PrefetchWait time.Duration
	// GroupCommitWindow is how long a finished task's result may wait for
	// others finishing together to share its transaction, never when no
	// other handler runs; negative: none. 0 to 100 ms; default 1 ms.
	// GroupCommitMax caps such a group: 1 to 1000; default 64.
	GroupCommitWindow time.Duration
	GroupCommitMax    int
	// EnqueueGroupMax caps the tasks that a Client's concurrent enqueues
	// share in one transaction while EnqueueGroupLanes of its
	// transactions are in flight (an enqueue never waits while fewer
	// are). 1 to 10000, default 256; lanes 1 to 64, default 1.
	EnqueueGroupMax   int
	EnqueueGroupLanes int
	// DispatchBuckets and DispatchTasks bound the buckets and tasks one
	// dispatcher transaction moves; DispatchLanes is how many connections
	// a dispatcher moves a backlog on at once. Defaults 128, 4096 and 2.
	DispatchBuckets int
	DispatchTasks   int
	DispatchLanes   int

	// Clock tells the time. Default (nil): the system clock.
	Clock Clock
	// MapVersion is the version of the shard map of a namespace spread
	// over several pools (lanes; see NewClient): 1 or more, or 0 (the
	// default) for no check. Every transaction on a lane then watches the
	// lane's map key and writes nothing when it names a newer version:
	// a process with an old map cannot write to a lane that moved since
	// (ErrShardMapVersion). It costs one round trip per such transaction.
	MapVersion int64
}

// QueueConfig names a queue a worker takes tasks from.
type QueueConfig struct {
	Name string
	// Weight is the queue's share under weighted priority (at least 1).
	Weight int
	// The queue's flow control (docs/flow-control.md), across every
	// worker process; zero fields limit nothing. A Server writes them to
	// Redis when it starts; Inspector.SetQueueLimits changes them at run
	// time.
	//
	// MaxRunning: at no instant do more than that many of its tasks run.
	// Rate, "N/period" ("10/1s", "600/1m"): at most N of its tasks start
	// in any window of that length. KeyMaxRunning and KeyRate are the same
	// for the tasks of each key (the Key option), keys being unbounded in
	// number.
	MaxRunning    int
	Rate          string
	KeyMaxRunning int
	KeyRate       string
}

// limits returns qc's flow control as stored, or an error wrapping
// ErrInvalid naming what is wrong.
func (qc QueueConfig) limits() (buckets.Limits, error) {
	if qc.MaxRunning < 0 || qc.KeyMaxRunning < 0 {
		return buckets.Limits{}, fmt.Errorf("engine: queue %s: a concurrency limit must be 0 (none) or more: %w", qc.Name, ErrInvalid)
	}
	rate, err := buckets.ParseRate(qc.Rate)
	if err != nil {
		return buckets.Limits{}, fmt.Errorf("engine: queue %s: rate: %w: %w", qc.Name, err, ErrInvalid)
	}
	keyRate, err := buckets.ParseRate(qc.KeyRate)
	if err != nil {
		return buckets.Limits{}, fmt.Errorf("engine: queue %s: key rate: %w: %w", qc.Name, err, ErrInvalid)
	}
	return buckets.Limits{MaxRunning: int64(qc.MaxRunning), Rate: rate, KeyMaxRunning: int64(qc.KeyMaxRunning), KeyRate: keyRate}, nil
}

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
	if c.Advanced.Resolution == 0 {
		c.Advanced.Resolution = 10 * time.Millisecond
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
	if c.Advanced.ClaimBatch == 0 {
		c.Advanced.ClaimBatch = 32
	}
	if c.Advanced.PrefetchWait == 0 {
		c.Advanced.PrefetchWait = 5 * time.Millisecond
	}
	if c.Advanced.GroupCommitWindow == 0 {
		c.Advanced.GroupCommitWindow = time.Millisecond
	}
	if c.Advanced.GroupCommitMax == 0 {
		c.Advanced.GroupCommitMax = 64
	}
	if c.Advanced.EnqueueGroupMax == 0 {
		c.Advanced.EnqueueGroupMax = 256
	}
	if c.Advanced.EnqueueGroupLanes == 0 {
		c.Advanced.EnqueueGroupLanes = 1
	}
	if c.Advanced.LeaseGrace == 0 {
		c.Advanced.LeaseGrace = 30 * time.Second
	}
	if c.Advanced.HeartbeatInterval == 0 {
		c.Advanced.HeartbeatInterval = 10 * time.Second
	}
	if c.Advanced.HeartbeatTTL == 0 {
		c.Advanced.HeartbeatTTL = max(30*time.Second, 3*c.Advanced.HeartbeatInterval)
	}
	if c.Advanced.IdleWait == 0 {
		c.Advanced.IdleWait = 20 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.RetryDelay == nil {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.Advanced.UnknownTypeGrace == 0 {
		c.Advanced.UnknownTypeGrace = time.Minute
	}
	if c.Advanced.MaxRecoveries == 0 {
		c.Advanced.MaxRecoveries = 5
	}
	if c.Advanced.MaxSnoozes == 0 {
		c.Advanced.MaxSnoozes = 1000
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
	if c.Advanced.ReapInterval == 0 {
		c.Advanced.ReapInterval = 30 * time.Second
	}
	if c.Advanced.DispatchBuckets == 0 {
		c.Advanced.DispatchBuckets = 128
	}
	if c.UnknownType == "" {
		c.UnknownType = "retry"
	}
	if c.Advanced.DispatchLanes == 0 {
		c.Advanced.DispatchLanes = 2
	}
	if c.Advanced.DispatchTasks == 0 {
		c.Advanced.DispatchTasks = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Advanced.Clock == nil {
		c.Advanced.Clock = clockwork.NewRealClock()
	}
	return c
}

// ConfigError is a Config setting that Validate refuses. It matches
// ErrInvalid with errors.Is.
type ConfigError struct {
	// Field names the setting as written in Go: "Concurrency",
	// "Queues[1].Weight".
	Field string
	// Msg says what is wrong with its value and what is wanted.
	Msg string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("engine: config %s: %s: %v", e.Field, e.Msg, ErrInvalid)
}

// Unwrap returns ErrInvalid.
func (e *ConfigError) Unwrap() error { return ErrInvalid }

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
	if c.Advanced.Resolution < time.Millisecond || c.Advanced.Resolution > time.Minute || c.Advanced.Resolution%time.Millisecond != 0 {
		bad("Advanced.Resolution", "%v: want whole milliseconds from 1ms to 60s", c.Advanced.Resolution)
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
		if q.MaxRunning < 0 {
			bad(fmt.Sprintf("Queues[%d].MaxRunning", i), "%d: want 0 (no limit) or more", q.MaxRunning)
		}
		if q.KeyMaxRunning < 0 {
			bad(fmt.Sprintf("Queues[%d].KeyMaxRunning", i), "%d: want 0 (no limit) or more", q.KeyMaxRunning)
		}
		if _, err := buckets.ParseRate(q.Rate); err != nil {
			bad(fmt.Sprintf("Queues[%d].Rate", i), "%v", err)
		}
		if _, err := buckets.ParseRate(q.KeyRate); err != nil {
			bad(fmt.Sprintf("Queues[%d].KeyRate", i), "%v", err)
		}
	}
	if c.Concurrency < 1 {
		bad("Concurrency", "%d: want at least 1", c.Concurrency)
	}
	if c.Advanced.ClaimBatch < 1 || c.Advanced.ClaimBatch > 1000 {
		bad("Advanced.ClaimBatch", "%d: want 1 to 1000", c.Advanced.ClaimBatch)
	}
	if c.Advanced.Prefetch > 1000 {
		bad("Advanced.Prefetch", "%d: want at most 1000 (negative: none)", c.Advanced.Prefetch)
	}
	if c.Advanced.PrefetchWait < 0 || c.Advanced.PrefetchWait > time.Second {
		bad("Advanced.PrefetchWait", "%v: want 0 to 1s", c.Advanced.PrefetchWait)
	}
	if c.Advanced.GroupCommitWindow > 100*time.Millisecond {
		bad("Advanced.GroupCommitWindow", "%v: want at most 100ms (negative: no group commit)", c.Advanced.GroupCommitWindow)
	}
	if c.Advanced.GroupCommitMax < 1 || c.Advanced.GroupCommitMax > 1000 {
		bad("Advanced.GroupCommitMax", "%d: want 1 to 1000", c.Advanced.GroupCommitMax)
	}
	if c.Advanced.EnqueueGroupMax < 1 || c.Advanced.EnqueueGroupMax > 10000 {
		bad("Advanced.EnqueueGroupMax", "%d: want 1 to 10000", c.Advanced.EnqueueGroupMax)
	}
	if c.Advanced.EnqueueGroupLanes < 1 || c.Advanced.EnqueueGroupLanes > 64 {
		bad("Advanced.EnqueueGroupLanes", "%d: want 1 to 64", c.Advanced.EnqueueGroupLanes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{
		{"Advanced.LeaseGrace", c.Advanced.LeaseGrace, time.Millisecond},
		{"Advanced.HeartbeatInterval", c.Advanced.HeartbeatInterval, 10 * time.Millisecond},
		{"Advanced.HeartbeatTTL", c.Advanced.HeartbeatTTL, time.Second},
		{"Advanced.IdleWait", c.Advanced.IdleWait, time.Second},
		{"Advanced.ReapInterval", c.Advanced.ReapInterval, 10 * time.Millisecond},
		{"DeadRetention", c.DeadRetention, time.Second},
	} {
		if d.v < d.min {
			bad(d.name, "%v: want at least %v", d.v, d.min)
		}
	}
	if c.Advanced.HeartbeatTTL%time.Second != 0 {
		bad("Advanced.HeartbeatTTL", "%v: want whole seconds (Redis 2.4 TTLs are seconds)", c.Advanced.HeartbeatTTL)
	}
	if c.Advanced.IdleWait%time.Second != 0 {
		bad("Advanced.IdleWait", "%v: want whole seconds (Redis 2.4 blocking timeouts are integers)", c.Advanced.IdleWait)
	}
	if c.Advanced.HeartbeatTTL < 2*c.Advanced.HeartbeatInterval {
		bad("Advanced.HeartbeatTTL", "%v: want at least twice Advanced.HeartbeatInterval (%v)", c.Advanced.HeartbeatTTL, c.Advanced.HeartbeatInterval)
	}
	if c.UnknownType != "" && c.UnknownType != "retry" && c.UnknownType != "dead" {
		bad("UnknownType", "%q: want retry or dead", c.UnknownType)
	}
	if c.Advanced.DispatchBuckets < 1 || c.Advanced.DispatchBuckets > 10000 {
		bad("Advanced.DispatchBuckets", "%d: want 1 to 10000", c.Advanced.DispatchBuckets)
	}
	if c.Advanced.MapVersion < 0 {
		bad("Advanced.MapVersion", "%d: want 1 or more, or 0 for no check", c.Advanced.MapVersion)
	}
	if c.Advanced.DispatchLanes < 1 || c.Advanced.DispatchLanes > 16 {
		bad("Advanced.DispatchLanes", "%d: want 1 to 16", c.Advanced.DispatchLanes)
	}
	if c.Advanced.DispatchTasks < 1 || c.Advanced.DispatchTasks > 100000 {
		bad("Advanced.DispatchTasks", "%d: want 1 to 100000", c.Advanced.DispatchTasks)
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
	st, err := buckets.NewLaneStore(c.Namespace, c.lane.index, c.Advanced.Resolution.Milliseconds())
	if err != nil {
		return c, nil, fmt.Errorf("engine: %w", err)
	}
	if c.Advanced.MapVersion > 0 {
		st.SetMapFence(c.Advanced.MapVersion)
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

func (c Config) maxRecoveries() int { return max(c.Advanced.MaxRecoveries, 0) }

func (c Config) unservedGraceMs() int64 { return max(c.Advanced.UnknownTypeGrace.Milliseconds(), 0) }

func (c Config) doneTTL() int64 {
	if c.DoneRetention < 0 {
		return 0
	}
	return max(1, int64(c.DoneRetention/time.Second))
}

// prefetch is how many tasks a worker may claim beyond Concurrency.
func (c Config) prefetch() int {
	if c.Advanced.Prefetch == 0 {
		return max(c.Advanced.ClaimBatch-c.Concurrency, 0)
	}
	return max(c.Advanced.Prefetch, 0)
}
