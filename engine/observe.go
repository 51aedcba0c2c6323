package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// Observer receives the engine's events, for metrics, tracing or logs
// that live outside the engine (see the metrics/prometheus package). Set
// it as Config.Observer; nil (the default) costs one comparison per event.
//
// Observe is called on the goroutine that made the change, after the
// transaction that made it committed: an event is never sent for a change
// that did not happen. It must return quickly and must not block (count
// in memory, hand off to a channel with a default case): the worker's
// hot path waits for it. It is called from many goroutines at once. The
// engine sends no Redis command for an observer.
//
// A change whose reply was lost (a dropped connection after EXEC) may
// have happened without an event; counts built from events are therefore
// a lower bound, and the counters Stats reads from Redis stay the exact
// ones.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventEnqueued: a task was written (one event per task of a batch):
	// by a producer (Enqueue, EnqueueChain's first step, EnqueueGroup's
	// members), by a Server's scheduler (a periodic firing), or by the result
	// that enqueues a chain's next step, a group's callback or a reply
	// task. Queue, Type, TaskID and Due are set.
	EventEnqueued EventKind = iota + 1
	// EventDispatched: a dispatcher round made Moved tasks ready and met
	// Conflicts transactions that found their buckets changed. Sent only
	// when one of them is not zero. Queue and Type are empty.
	EventDispatched
	// EventStarted: a worker claimed a task and is about to run its
	// handler. Due is when it became due and Time when it was claimed
	// (Time minus Due is the task's lateness).
	EventStarted
	// EventFinished: a run's result was recorded. State says which
	// (StateRetrying: it failed and runs again at Due; StateScheduled:
	// its handler snoozed it until Due); Duration is the run's time from
	// claim to result; Err is the handler's error, if any.
	EventFinished
	// EventDead: a task went to the dead letters; Reason says why. After
	// a run it follows its EventFinished; it is also sent for a task
	// recovered too many times.
	EventDead
	// EventRecovered: a running task was returned to its queue, or
	// counted as recovered and buried, because its worker died or its
	// lease ran out (Reason says which).
	EventRecovered
)

func (k EventKind) String() string {
	switch k {
	case EventEnqueued:
		return "enqueued"
	case EventDispatched:
		return "dispatched"
	case EventStarted:
		return "started"
	case EventFinished:
		return "finished"
	case EventDead:
		return "dead"
	case EventRecovered:
		return "recovered"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one thing that happened; which fields are set depends on Kind.
type Event struct {
	Kind    EventKind
	Queue   string
	Type    string
	TaskID  string
	Attempt int // the run's attempt (1 on the first), for Started, Finished, Dead
	// Time is when it happened, on the engine's Clock.
	Time     time.Time
	Due      time.Time     // Enqueued, Started; Finished when it runs again
	Duration time.Duration // Finished
	// State is where a Finished run left its task: StateDone, StateRetrying
	// (failed; it runs again), StateScheduled (the handler snoozed it:
	// not a failure) or StateDead.
	State  State
	Err    error  // Finished with a failure
	Reason string // Dead, Recovered
	// Moved and Conflicts are set on EventDispatched.
	Moved, Conflicts int
}

// observeEnqueued reports records written at now.
func (c *Config) observeEnqueued(recs []*buckets.Record, now time.Time) {
	if c.Observer == nil {
		return
	}
	for _, r := range recs {
		c.Observer.Observe(Event{Kind: EventEnqueued, Queue: r.Queue, Type: r.Type, TaskID: r.ID,
			Time: now, Due: fromMs(r.Due)})
	}
}

// observeStart reports a claimed task about to run.
func (w *worker) observeStart(r *buckets.Record) {
	if w.cfg.Observer == nil {
		return
	}
	w.cfg.Observer.Observe(Event{Kind: EventStarted, Queue: r.Queue, Type: r.Type, TaskID: r.ID,
		Attempt: r.Attempts + 1, Time: fromMs(r.Started), Due: fromMs(r.Due)})
}

// observeOutcome reports a recorded result; r is the record as written.
// It runs once per task on the run's goroutine: without an Observer it
// never enters reportOutcome, whose frame (two Events) would grow that
// goroutine's stack.
func (w *worker) observeOutcome(r *buckets.Record, out buckets.Outcome, herr error) {
	if w.cfg.Observer != nil {
		w.reportOutcome(r, out, herr)
	}
}

// reportOutcome is observeOutcome with an Observer.
func (w *worker) reportOutcome(r *buckets.Record, out buckets.Outcome, herr error) {
	now := w.cfg.Advanced.Clock.Now()
	e := Event{Kind: EventFinished, Queue: r.Queue, Type: r.Type, TaskID: r.ID, Attempt: r.Attempts,
		Time: now, Duration: max(0, now.Sub(fromMs(r.Started))), Err: herr}
	switch {
	case out == buckets.Done:
		e.State, e.Attempt = StateDone, r.Attempts+1
	case out == buckets.Again && r.State == buckets.StateRetry:
		e.State, e.Due = StateRetrying, fromMs(r.Due)
	case out == buckets.Again:
		e.State, e.Attempt, e.Due = StateScheduled, r.Attempts+1, fromMs(r.Due)
	case out == buckets.Bury:
		e.State = StateDead
	default:
		return
	}
	w.cfg.Observer.Observe(e)
	// The tasks the result's transaction enqueued: a chain's next step,
	// a group's callback, a reply task.
	w.cfg.observeEnqueued(r.Spawned, now)
	if e.State == StateDead {
		reason := "failed"
		if _, ok := IsSnooze(herr); ok {
			reason = "snoozed_too_often"
		}
		w.cfg.Observer.Observe(Event{Kind: EventDead, Queue: r.Queue, Type: r.Type, TaskID: r.ID,
			Attempt: r.Attempts, Time: now, Err: herr, Reason: reason})
	}
}

// observeRecovered reports what a Requeue for why recovered.
func (c *Config) observeRecovered(res buckets.RequeueResult, why buckets.Reason) {
	if c.Observer == nil {
		return
	}
	now := c.Advanced.Clock.Now()
	for _, t := range res.Recovered {
		c.Observer.Observe(Event{Kind: EventRecovered, Queue: t.Queue, Type: t.Type, TaskID: t.ID, Time: now, Reason: reasonLabel(why)})
		if t.Buried {
			c.Observer.Observe(Event{Kind: EventDead, Queue: t.Queue, Type: t.Type, TaskID: t.ID, Time: now,
				Reason: "recovered_too_often"})
		}
	}
}

// observeDispatch reports a dispatcher round.
func (c *Config) observeDispatch(res buckets.MoveResult) {
	if c.Observer == nil || res.Tasks+res.Conflicts == 0 {
		return
	}
	c.Observer.Observe(Event{Kind: EventDispatched, Time: c.Advanced.Clock.Now(), Moved: res.Tasks, Conflicts: res.Conflicts})
}

// LiveWorkers counts the worker processes whose heartbeat is alive, and
// all registered ones (the dead are forgotten by a reaper): one SMEMBERS
// and one pipelined round of EXISTS.
func (c *laneClient) LiveWorkers(ctx context.Context) (alive, registered int, err error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ids, live, err := c.store.Workers(ctx, conn)
	if err != nil {
		return 0, 0, failed("read workers", err)
	}
	for _, a := range live {
		if a {
			alive++
		}
	}
	return alive, len(ids), nil
}

// reasonLabel names a recovery's reason in events: "worker_died" or
// "lease_expired".
func reasonLabel(why buckets.Reason) string {
	switch why {
	case buckets.WorkerDied:
		return "worker_died"
	case buckets.LeaseExpired:
		return "lease_expired"
	}
	return "shutdown"
}
