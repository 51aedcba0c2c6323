package engine

import (
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/safetext"
)

// Task is what a handler is given: one run of one task.
type Task struct {
	ID          string
	Queue       string
	Type        string
	Payload     []byte
	Attempt     int // 1 on the first run; failures so far plus one
	MaxAttempts int
	Recoveries  int    // times a worker died or lost the lease while running it
	Snoozes     int    // times its handler snoozed it (Snooze): not failures
	Priority    int    // its level in its queue, 1 (first, the default) to 4 (Priority)
	Key         string // its flow-control key in its queue (Key); "" for none
	// Expires is when the task stops being worth starting (ExpireIn);
	// zero: never.
	Expires time.Time
	// Run is 1 on the first run of the task and counts every start since,
	// whatever ended the earlier ones (a failure, a retry asked for, a
	// worker that died or was stopped, a lost lease): a handler sees a
	// re-run as Run > 1.
	Run       int
	Started   time.Time // when this run was claimed (the start a rate limit counts)
	Timeout   time.Duration
	Created   time.Time
	Due       time.Time
	LastError string // the previous failure, if any
	// Metadata is what the producer attached with the Metadata option
	// (a trace context, say); nil when nothing. Handlers must not change it.
	Metadata map[string]string

	// Periodic names the periodic entry whose firing this is ("" for
	// other tasks); Due is then the firing time.
	Periodic string

	// Workflow is the task's part in a chain or group (workflow.go);
	// nil for other tasks.
	Workflow *TaskWorkflow
}

func taskFromRecord(r *buckets.Record) *Task {
	t := taskOf(r)
	return &t
}

// taskOf is taskFromRecord as a value, for a TaskInfo to embed without
// a Task of its own on the heap.
func taskOf(r *buckets.Record) Task {
	return Task{
		ID: r.ID, Queue: r.Queue, Type: r.Type, Payload: r.Payload,
		Attempt: r.Attempts + 1, MaxAttempts: r.MaxAttempts, Recoveries: r.Recoveries, Snoozes: r.Snoozes,
		Run: r.Runs, Started: fromMs(r.Started), Timeout: time.Duration(r.TimeoutMs) * time.Millisecond,
		Created: fromMs(r.Created), Due: fromMs(r.Due), LastError: r.LastError,
		Metadata: r.Metadata, Expires: fromMs(r.ExpireAt),

		Periodic: r.Periodic, Workflow: workflowOf(r),
		Priority: r.Level(), Key: r.Key,
	}
}

// State is where a task is, as Lookup reports it.
type State string

// Task states.
const (
	StateScheduled State = "scheduled" // waiting for its due time
	StateReady     State = "ready"     // due, waiting for a worker
	StateRunning   State = "running"   // a worker runs it
	StateRetrying  State = "retrying"  // failed, waiting for its next attempt
	StateDone      State = "done"      // succeeded (kept for Config.DoneRetention)
	StateDead      State = "dead"      // in the dead letters
	StateCancelled State = "cancelled" // cancelled before it ran
)

// TaskInfo is a task as Enqueue and its kin, Lookup, and the Inspector's
// Task and ListTasks report it. For a task just enqueued, State is
// StateReady or StateScheduled and Due the time it becomes ready (rounded
// up to the millisecond; the producer's now for a task due at once);
// Payload is the caller's slice.
type TaskInfo struct {
	Task
	State    State
	Attempts int       // failed runs so far
	Started  time.Time // last run's start
	Finished time.Time // when it succeeded, died or was cancelled
	Worker   string    // the worker process running it
	// Lease is a running task's lease deadline (on its worker's clock).
	Lease time.Time
	// Preview is the payload's start, printable, at most 64 characters,
	// ending with "…" when cut (the Inspector's calls).
	Preview string
	// Result is a done task's result while it is kept
	// (Config.ResultRetention), from Inspector.Task; Client.Result reads
	// it too.
	Result []byte
	// Progress, ProgressNote and ProgressTime are what its handler last
	// reported with SetProgress, and when (on the worker's clock); zero
	// when it reported nothing. Lookup, Inspector.Task and the running
	// tasks of Inspector.ListTasks read them.
	Progress     float64
	ProgressNote string
	ProgressTime time.Time
}

func infoFromRecord(r *buckets.Record, where buckets.Where) *TaskInfo {
	ti := &TaskInfo{Task: taskOf(r), Attempts: r.Attempts,
		Started: fromMs(r.Started), Finished: fromMs(r.Finished), Worker: r.Worker}
	switch r.State {
	case buckets.StateWaiting:
		ti.State = StateReady
		if where == buckets.InBucket {
			ti.State = StateScheduled
		}
	case buckets.StateRetry:
		ti.State = StateReady
		if where == buckets.InBucket {
			ti.State = StateRetrying
		}
	case buckets.StateRunning:
		ti.State = StateRunning
	case buckets.StateDone:
		ti.State = StateDone
	case buckets.StateDead:
		ti.State = StateDead
	case buckets.StateCancelled:
		ti.State = StateCancelled
	}
	ti.setProgress(r.Progress)
	return ti
}

// setProgress copies a progress read from Redis; nil leaves none.
func (ti *TaskInfo) setProgress(p *buckets.Progress) {
	if p != nil {
		ti.Progress, ti.ProgressNote, ti.ProgressTime = p.Value, p.Note, fromMs(p.At)
	}
}

// Option sets a per-task choice for Enqueue and its kin.
type Option interface {
	apply(*taskOptions) error
}

type taskOptions struct {
	id          string
	queue       string
	maxAttempts int
	timeout     time.Duration
	expireIn    time.Duration
	key         string
	at          time.Time
	in          time.Duration
	hasIn       bool
	metadata    map[string]string

	unique       string // "k:<key>" for UniqueKey
	uniqueDigest bool   // Unique: the key is the digest
	uniqueTTL    int64  // seconds; 0 until the task ends
	replyTo      string
	shardKey     string // ShardKey: picks the lane of a sharded client
	priority     int    // Priority: the level, 0 for the default (1)
}

type optionFunc func(*taskOptions) error

func (f optionFunc) apply(o *taskOptions) error { return f(o) }

// TaskID gives the task the caller's own id instead of a random one,
// which makes Enqueue safe to retry: if the id exists, nothing is written
// and the error matches ErrTaskExists. After an error matching
// ErrUncertain (the reply to the write was lost) retry with the same id:
// you then get either the task written once or ErrTaskExists. The check
// and the write are one transaction, so producers racing with one id get
// one task. An id is 1 to 128 printable ASCII bytes without spaces, and
// stays taken while the task's record exists (see ErrTaskExists).
//
// The forms of the ids the engine gives its own tasks are refused with
// ErrInvalid: a periodic firing's ("p:…@…": starting with "p:" and
// holding an '@'), a group callback's ("…~cb"), a reply task's
// ("…~r<run>.<finished>"), and a workflow step's or member's
// ("<workflow>~<i>") while that workflow exists.
func TaskID(id string) Option {
	return optionFunc(func(o *taskOptions) error {
		if err := validateID(id); err != nil {
			return &engineError{msg: err.Error(), kind: ErrInvalid, cause: err}
		}
		if why := reservedID(id); why != "" {
			err := fmt.Errorf("engine: task id %s is reserved: %s: %w", safetext.Quote(id), why, ErrInvalid)
			return &engineError{msg: err.Error(), kind: ErrInvalid, cause: err}
		}
		o.id = id
		return nil
	})
}

// MaxIDLen is the longest task id TaskID accepts, in bytes.
const maxIDLen = 128

// ValidateID checks the form of any task id: 1 to 128 bytes, each a
// printable ASCII character other than space. The error matches
// ErrInvalid. TaskID also refuses the forms the engine reserves for its
// own tasks.
func validateID(id string) error {
	if len(id) == 0 || len(id) > maxIDLen {
		return fmt.Errorf("engine: task id %s: want 1 to %d bytes, not %d: %w", safetext.Quote(id), maxIDLen, len(id), ErrInvalid)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("engine: task id %s: byte %d is %q; want printable ASCII without spaces: %w", safetext.Quote(id), i, c, ErrInvalid)
		}
	}
	return nil
}

// Queue puts the task on the named queue instead of Config.DefaultQueue.
func Queue(name string) Option {
	return optionFunc(func(o *taskOptions) error {
		if !buckets.ValidName(name) {
			return validateQueue(name)
		}
		o.queue = name
		return nil
	})
}

// MaxAttempts sets how many failed runs the task may have before it goes
// to the dead letters (at least 1).
func MaxAttempts(n int) Option {
	return optionFunc(func(o *taskOptions) error {
		if n < 1 {
			return fmt.Errorf("engine: MaxAttempts(%d): want at least 1: %w", n, ErrInvalid)
		}
		o.maxAttempts = n
		return nil
	})
}

// Timeout bounds one run of the task's handler (at least 1 ms).
func Timeout(d time.Duration) Option {
	return optionFunc(func(o *taskOptions) error {
		if d < time.Millisecond {
			return fmt.Errorf("engine: Timeout(%v): want at least 1ms: %w", d, ErrInvalid)
		}
		o.timeout = d
		return nil
	})
}

// ExpireIn says the task stops being worth starting d after it is
// enqueued: one not started by then never starts and goes to the dead
// letters with the reason "expired", wherever it waits (its bucket, its
// ready list, a retry, a paused queue: it is buried when a worker would
// take it). d must leave room for its due time. Not for a workflow's
// tasks.
func ExpireIn(d time.Duration) Option {
	return optionFunc(func(o *taskOptions) error {
		if d < time.Millisecond {
			return fmt.Errorf("engine: ExpireIn(%v): want at least 1ms: %w", d, ErrInvalid)
		}
		o.expireIn = d
		return nil
	})
}

// Key gives the task a flow-control key within its queue (a tenant or a
// customer, say: 1-64 of A-Z a-z 0-9 _ . -). A queue's keyed tasks of
// one level wait in a list per key and are taken round-robin by key, so
// one key's backlog does not hold up another's tasks; the queue's
// KeyMaxRunning and KeyRate (QueueConfig) limit each key
// (docs/flow-control.md). Not for a workflow's tasks.
func Key(k string) Option {
	return optionFunc(func(o *taskOptions) error {
		if !buckets.ValidName(k) {
			return fmt.Errorf("engine: Key(%s): want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(k), ErrInvalid)
		}
		o.key = k
		return nil
	})
}

// Due times a task can have: a record holds whole Unix milliseconds from
// 1 to the end of year 9999 (a score Redis keeps exactly, and a time every
// listing prints). At refuses others with ErrInvalid.
var (
	minDue = time.UnixMilli(1)
	maxDue = time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
)

// At makes the task due at t. A time in the past means now. t must be
// after 1970-01-01T00:00:00Z and at most 9999-12-31T23:59:59.999Z (else
// ErrInvalid); the zero time means now. The last At or In wins.
func At(t time.Time) Option { return dueOption{at: t} }

// In makes the task due d after it is enqueued, on the Client's clock
// (its TaskInfo.Due says when). The last At or In wins.
func In(d time.Duration) Option { return dueOption{in: d, isIn: true} }

// dueOption is At(at), or In(in) when isIn.
type dueOption struct {
	at   time.Time
	in   time.Duration
	isIn bool
}

func (d dueOption) apply(o *taskOptions) error {
	if !d.isIn {
		o.at, o.hasIn = d.at, false
		return nil
	}
	if d.in < 0 {
		return fmt.Errorf("engine: In(%v): want 0 or more: %w", d.in, ErrInvalid)
	}
	o.in, o.hasIn, o.at = d.in, true, time.Time{}
	return nil
}

// Metadata attaches string pairs to the task that its handler finds in
// Task.Metadata: a trace context, a tenant, a correlation id. Several
// Metadata options add up (a later value for a key wins). At most 32
// pairs, keys 1-128 bytes, 4 KiB in all, UTF-8; the pairs are stored in
// the task's record, so keep them small.
func Metadata(m map[string]string) Option {
	return optionFunc(func(o *taskOptions) error {
		if len(m) == 0 {
			return nil
		}
		if o.metadata == nil {
			o.metadata = make(map[string]string, len(m))
		}
		for k, v := range m {
			o.metadata[k] = v
		}
		if err := buckets.ValidateMetadata(o.metadata); err != nil {
			return fmt.Errorf("engine: Metadata: %s: %w", err.Error(), ErrInvalid)
		}
		return nil
	})
}

// NewTask is one task for EnqueueBatch.
type NewTask struct {
	Type    string
	Payload []byte
	Options []Option
}

// record builds and checks a task record from the caller's words; chosen
// says whether the id is the caller's (TaskID).
func (c *Config) record(now time.Time, typ string, payload []byte, opts []Option) (r *buckets.Record, chosen bool, err error) {
	o := taskOptions{queue: c.DefaultQueue, maxAttempts: c.DefaultMaxAttempts, timeout: c.DefaultTimeout}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt.apply(&o); err != nil {
			return nil, false, err
		}
	}
	due := now
	if o.hasIn {
		due = now.Add(o.in)
	} else if !o.at.IsZero() {
		due = o.at
	}
	if due.Before(minDue) || due.After(maxDue) {
		return nil, false, fmt.Errorf("engine: due time %s: want %s to %s (what a task record holds): %w",
			due.UTC().Format(time.RFC3339Nano), minDue.UTC().Format(time.RFC3339Nano), maxDue.UTC().Format(time.RFC3339Nano), ErrInvalid)
	}
	if payload == nil {
		payload = []byte{}
	}
	// Stored in whole milliseconds, rounded up so that a task is never
	// ready early; but a task due by now goes straight to its ready list,
	// which the store decides by comparing with now in milliseconds.
	dueMs := msCeil(due)
	if !due.After(now) {
		dueMs = min(dueMs, ms(now))
	}
	id := o.id
	if id == "" {
		id = newIDAt(now)
	}
	r = &buckets.Record{
		ID: id, Queue: o.queue, Type: typ, Payload: payload,
		State: buckets.StateWaiting, MaxAttempts: o.maxAttempts, TimeoutMs: o.timeout.Milliseconds(),
		Created: ms(now), Due: max(dueMs, 1), Metadata: o.metadata,
		Unique: o.unique, UniqueTTL: o.uniqueTTL, ReplyTo: o.replyTo,
		Priority: levelOf(o.priority), Key: o.key,
	}
	if o.expireIn > 0 {
		r.ExpireAt = ms(now.Add(o.expireIn))
	}
	if o.uniqueDigest {
		r.Unique, r.UniqueTTL = uniqueDigest(r.Queue, r.Type, payload), o.uniqueTTL
	}
	if err := r.Validate(c.MaxPayload); err != nil {
		return nil, false, &engineError{msg: "engine: " + err.Error(), kind: kindOf(err), cause: err}
	}
	return r, o.id != "", nil
}
