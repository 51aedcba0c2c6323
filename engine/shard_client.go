package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Client enqueues tasks and follows them: their state, outcome and
// result, and their cancellation. It is safe for concurrent use.
//
// Over several lanes (NewClient with a pool per lane) it routes each call
// to the lane that holds the task: a task's lane is part of its id
// (Client.LaneOf). A task with a TaskID goes to its id's lane and one with a
// unique key (Unique, UniqueKey) to the lane its key hashes to, so that
// the check for an existing id or holder and the write are one
// transaction on one server; the two must agree when a task has both. A
// task with ShardKey goes to the key's lane; any other task to the next
// lane, round-robin.
//
// When a lane's server cannot be reached (or refuses writes under another
// shard-map version), a task without a TaskID or unique key is written to
// another lane instead, and gets an id of that lane; this is counted
// (Rerouted) and logged. Such a lane is then avoided by the round-robin
// for a backoff that doubles from 100 ms to 5 s while its failures
// continue. A failure after the write was sent (ErrUncertain) is
// returned, never rerouted: the task may have been written.
type Client struct {
	lanes []*laneClient
	cfg   Config

	next     atomic.Uint64
	health   []laneHealth
	rerouted atomic.Int64
}

// laneHealth tracks a lane that failed: it is avoided until downUntil
// (Unix ns), a backoff that doubles while failures continue.
type laneHealth struct {
	downUntil atomic.Int64
	step      atomic.Int64
}

// Lane backoff bounds for producers.
const (
	laneMinBackoff = 100 * time.Millisecond
	laneMaxBackoff = 5 * time.Second
)

func (h *laneHealth) fail(now time.Time) {
	d := time.Duration(h.step.Load()) * 2
	d = min(max(d, laneMinBackoff), laneMaxBackoff)
	h.step.Store(int64(d))
	h.downUntil.Store(now.Add(d).UnixNano())
}

func (h *laneHealth) ok() {
	if h.step.Load() != 0 {
		h.step.Store(0)
		h.downUntil.Store(0)
	}
}

func (h *laneHealth) up(now time.Time) bool { return now.UnixNano() >= h.downUntil.Load() }

// NewClient returns a Client with cfg (zero fields take their defaults)
// over one pool (one lane), or over one pool per lane of a namespace
// spread over several servers, in lane order (see ErrShardMapVersion and
// docs/scaling.md). It never closes the pools.
func NewClient(cfg Config, pools ...*redis.Pool) (*Client, error) {
	if err := checkPools(pools); err != nil {
		return nil, err
	}
	c := &Client{health: make([]laneHealth, len(pools))}
	for k, p := range pools {
		lc, err := newLaneClient(p, laneConfig(cfg, k))
		if err != nil {
			return nil, err
		}
		c.lanes = append(c.lanes, lc)
	}
	c.cfg = c.lanes[0].cfg
	return c, nil
}

// Lanes is the number of lanes.
func (c *Client) Lanes() int { return len(c.lanes) }

// LaneOf returns the lane of task id, as every call routes it: a
// generated id ends with "~k", its lane; a generated id without it is in
// lane 0; any other id (chosen with TaskID) hashes to a lane. A caller may
// pick a lane for its own id by ending it with "~k". A reply task
// ("<id>~r<run>.<finished>") is in the lane of <id>.
func (c *Client) LaneOf(id string) int { return laneOf(id, len(c.lanes)) }

// Rerouted counts the tasks written to another lane than the one first
// chosen because that lane could not be reached.
func (c *Client) Rerouted() int64 { return c.rerouted.Load() }

// Enqueue adds a task and returns what was written: its id, queue, due
// time and state (ready, or scheduled with At or In). The record, its
// place in the ready list or bucket and the wake-up of idle workers are
// written in one MULTI/EXEC: once Enqueue returns nil the task is in
// Redis and will run at least once. An invalid type, queue, option or an
// oversized payload is refused before anything is written.
//
// With TaskID, an id that exists is refused (ErrTaskExists) and nothing is
// written. An error matching ErrUncertain means the connection failed
// after the write was sent: retry with the same TaskID to make sure the
// task is written exactly once.
func (c *Client) Enqueue(ctx context.Context, typ string, payload []byte, opts ...Option) (*TaskInfo, error) {
	if len(c.lanes) == 1 {
		return c.lanes[0].Enqueue(ctx, typ, payload, opts...)
	}
	infos, err := c.EnqueueBatch(ctx, []NewTask{{Type: typ, Payload: payload, Options: opts}})
	if err != nil {
		var be *BatchError
		if errors.As(err, &be) {
			return nil, be.Errs[0]
		}
		return nil, err
	}
	return infos[0], nil
}

// BatchError says which tasks of an EnqueueBatch over several lanes were
// not written: each lane's tasks are written or not together, and one
// lane may fail while others succeed. errors.Is and errors.As see each
// lane's error.
type BatchError struct {
	// Errs holds, per task in the order given, nil when it was written,
	// else its lane's error.
	Errs []error
}

func (e *BatchError) Error() string {
	failed := 0
	for _, err := range e.Errs {
		if err != nil {
			failed++
		}
	}
	return fmt.Sprintf("engine: %d of %d tasks not written: %v", failed, len(e.Errs), errors.Join(e.Unwrap()...))
}

// Unwrap returns the lanes' distinct errors.
func (e *BatchError) Unwrap() []error {
	var errs []error
	seen := map[error]bool{}
	for _, err := range e.Errs {
		if err != nil && !seen[err] {
			seen[err] = true
			errs = append(errs, err)
		}
	}
	return errs
}

// batchResult says where each task of a batch over several lanes went.
type batchResult struct {
	Tasks []*TaskInfo // nil for a task whose lane failed
	Lanes []int       // the lane each task was written to (or last tried)
	Errs  []error     // nil when written, else its lane's error
}

// EnqueueBatch adds many tasks in one round trip and one MULTI/EXEC per
// lane: all of a lane's tasks are written, or (with an error) none. Every
// task is checked before anything is sent; a bad task fails the call with
// nothing written. It returns what was written, in order, as Enqueue does.
// With one lane (one pool) the batch is all or nothing. Over several,
// lanes are written at once and one may fail while others succeed: the
// error is then a *BatchError and the failed tasks' entries are nil;
// tasks that may move (without TaskID or unique key) of a lane that
// cannot be reached are written to another lane instead, all together.
//
// The tasks of a batch of several are at most 4 MiB together
// (else ErrTooLarge). Tasks with a TaskID are checked to be new in
// the same transaction (one more round trip): if any id exists, none of
// its lane's tasks is written and the error is a *ExistsError naming
// every id that exists. Two tasks of one batch may not share an id.
func (c *Client) EnqueueBatch(ctx context.Context, tasks []NewTask) ([]*TaskInfo, error) {
	if len(c.lanes) == 1 {
		return c.lanes[0].EnqueueBatch(ctx, tasks)
	}
	n := len(c.lanes)
	now := c.cfg.Advanced.Clock.Now()
	recs := make([]*buckets.Record, len(tasks))
	chosen := make([]bool, len(tasks))
	movable := make([]bool, len(tasks))
	res := &batchResult{Tasks: make([]*TaskInfo, len(tasks)), Lanes: make([]int, len(tasks)), Errs: make([]error, len(tasks))}
	ids := map[string]int{}
	for i, t := range tasks {
		r, mine, err := c.cfg.record(now, t.Type, t.Payload, t.Options)
		if err == nil {
			res.Lanes[i], movable[i], err = c.route(r, mine, t.Options, now)
		}
		if err != nil {
			if len(tasks) > 1 {
				return nil, &engineError{msg: fmt.Sprintf("engine: task %d: %s", i, strings.TrimPrefix(err.Error(), "engine: ")), kind: kindOf(err), cause: err}
			}
			return nil, err
		}
		if mine {
			if j, dup := ids[r.ID]; dup {
				return nil, fmt.Errorf("engine: tasks %d and %d both have id %q: %w", j, i, r.ID, ErrInvalid)
			}
			ids[r.ID] = i
		} else {
			r.ID = laneTaskID(res.Lanes[i], n, r.Created)
		}
		recs[i], chosen[i] = r, mine
	}
	if len(recs) > 1 {
		if err := checkWriteBytes(ErrTooLarge, fmt.Sprintf("batch of %d tasks", len(recs)), recs); err != nil {
			return nil, err
		}
	}
	tried := make([]map[int]bool, len(tasks))
	pending := make([]int, len(tasks))
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		byLane := map[int][]int{}
		for _, i := range pending {
			byLane[res.Lanes[i]] = append(byLane[res.Lanes[i]], i)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var again []int
		for k, idx := range byLane {
			wg.Go(func() {
				err := c.writeLane(ctx, k, now, recs, chosen, idx, res)
				if err == nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, i := range idx {
					res.Errs[i] = err
				}
				if !reroutable(err) || ctx.Err() != nil {
					return
				}
				for _, i := range idx {
					if !movable[i] {
						continue
					}
					if tried[i] == nil {
						tried[i] = map[int]bool{}
					}
					tried[i][k] = true
					if len(tried[i]) < n {
						again = append(again, i)
					}
				}
			})
		}
		wg.Wait()
		pending = pending[:0]
		// The movable tasks of a failed lane go to one other lane
		// together, as one transaction.
		from := map[int][]int{}
		for _, i := range again {
			from[res.Lanes[i]] = append(from[res.Lanes[i]], i)
		}
		for k, idx := range from {
			skip := map[int]bool{}
			for _, i := range idx {
				for l := range tried[i] {
					skip[l] = true
				}
			}
			to := c.pick(time.Now(), skip)
			if to < 0 {
				continue
			}
			c.rerouted.Add(int64(len(idx)))
			c.cfg.Logger.Warn("lane unreachable; tasks written to another lane", "from_lane", k, "to_lane", to, "tasks", len(idx), keyErr, res.Errs[idx[0]])
			for _, i := range idx {
				res.Lanes[i], res.Errs[i] = to, nil
				recs[i].ID = laneTaskID(to, n, recs[i].Created)
				pending = append(pending, i)
			}
		}
	}
	for _, e := range res.Errs {
		if e != nil {
			return res.Tasks, &BatchError{Errs: res.Errs}
		}
	}
	return res.Tasks, nil
}

// writeLane writes the tasks idx of recs to lane k in one transaction.
func (c *Client) writeLane(ctx context.Context, k int, now time.Time, recs []*buckets.Record, chosen []bool, idx []int, res *batchResult) error {
	lr := make([]*buckets.Record, len(idx))
	var mine []string
	for j, i := range idx {
		lr[j] = recs[i]
		if chosen[i] {
			mine = append(mine, recs[i].ID)
		}
	}
	infos, err := c.lanes[k].enqueueRecords(ctx, now, lr, mine)
	if err != nil {
		if reroutable(err) {
			c.health[k].fail(time.Now())
		}
		return fmt.Errorf("lane %d: %w", k, err)
	}
	c.health[k].ok()
	for j, i := range idx {
		res.Tasks[i] = infos[j]
	}
	return nil
}

// reroutable reports whether a lane's enqueue error says that nothing
// was written and another lane may take the tasks: the lane could not be
// reached or refused under another map version. A refusal of the tasks
// themselves, or a write whose reply was lost, is not.
func reroutable(err error) bool {
	switch {
	case errors.Is(err, ErrUncertain), errors.Is(err, ErrTaskExists), errors.Is(err, ErrDuplicate),
		errors.Is(err, ErrInvalid), errors.Is(err, ErrTooLarge),
		errors.Is(err, context.Canceled):
		return false
	}
	return true
}

// route picks the lane of a new task; movable says whether it may go to
// another lane when that one cannot be reached.
func (c *Client) route(r *buckets.Record, mine bool, opts []Option, now time.Time) (lane int, movable bool, err error) {
	n := len(c.lanes)
	var o taskOptions
	for _, opt := range opts {
		if opt != nil {
			_ = opt.apply(&o) // record() has checked them
		}
	}
	type rule struct {
		what string
		lane int
	}
	var rules []rule
	if mine {
		rules = append(rules, rule{"task id", laneOf(r.ID, n)})
	}
	if r.Unique != "" {
		rules = append(rules, rule{"unique key", hashLane(r.Unique, n)})
	}
	if o.shardKey != "" {
		rules = append(rules, rule{"shard key", hashLane(o.shardKey, n)})
	}
	for _, x := range rules[min(1, len(rules)):] {
		if x.lane != rules[0].lane {
			return 0, false, fmt.Errorf("engine: the task's %s is in lane %d but its %s in lane %d; a task lives in one lane (end a TaskID with \"~%d\" to place it): %w",
				rules[0].what, rules[0].lane, x.what, x.lane, x.lane, ErrInvalid)
		}
	}
	switch {
	case mine || r.Unique != "":
		return rules[0].lane, false, nil
	case len(rules) > 0:
		return rules[0].lane, true, nil
	}
	return c.pick(now, nil), true, nil
}

// pick returns the next lane round-robin that is not in skip, preferring
// lanes not backing off; -1 when skip holds every lane.
func (c *Client) pick(now time.Time, skip map[int]bool) int {
	n := len(c.lanes)
	start := int(c.next.Add(1) % uint64(n))
	fallback := -1
	for j := 0; j < n; j++ {
		k := (start + j) % n
		if skip[k] {
			continue
		}
		if c.health[k].up(now) {
			return k
		}
		if fallback < 0 {
			fallback = k
		}
	}
	return fallback
}

// Cancel removes a task that has not started, atomically: it will not
// run. It returns ErrNotFound, ErrAlreadyRunning or ErrAlreadyDone when
// it cannot.
//
// Over several lanes, this and every call by id ask the id's lane first
// and, while the answer is ErrNotFound, the other lanes: the steps of a
// workflow ("<workflow>~<i>") live in the workflow's lane, which their
// ids do not name.
func (c *Client) Cancel(ctx context.Context, id string) error {
	_, err := byID(c, id, func(l *laneClient) (struct{}, error) { return struct{}{}, l.Cancel(ctx, id) })
	return err
}

// Lookup reports a task's state and times. Done and cancelled tasks are
// found for Config.DoneRetention, dead ones for Config.DeadRetention.
func (c *Client) Lookup(ctx context.Context, id string) (*TaskInfo, error) {
	return byID(c, id, func(l *laneClient) (*TaskInfo, error) { return l.Lookup(ctx, id) })
}

// Wait blocks until task id is done, dead or cancelled, and returns its
// outcome (with the result of a done task). It does not poll: it marks
// the task as waited for and blocks on its completion list (BRPOPLPUSH,
// whole seconds at a time, re-armed until ctx ends), on a connection of
// its own; every final transition after the mark pushes that list. A task
// that ended before Wait (or between two blocks) is found at once, from
// its completion list or its record: a success whose record is kept at
// least as long as a completion list would be pushes none when nobody
// waits, and its record says the outcome. ErrNotFound: no such task (or
// its record and completion both expired). When ctx ends first, ctx's
// error.
func (c *Client) Wait(ctx context.Context, id string) (*Outcome, error) {
	return byID(c, id, func(l *laneClient) (*Outcome, error) { return l.Wait(ctx, id) })
}

// Result returns the result a done task recorded with SetResult, or nil
// when it recorded none, has not succeeded, or its retention passed.
func (c *Client) Result(ctx context.Context, id string) ([]byte, error) {
	return byID(c, id, func(l *laneClient) ([]byte, error) { return l.Result(ctx, id) })
}

// EnqueueChain enqueues chain id: steps run one after another, each once
// its predecessor succeeded (after its own Delay). Only the first step is
// a task at first: the transaction that records a step's success writes
// the next one. A step that dies stops the chain; retrying it from the
// dead letters (Inspector.Act with ActionRetry) resumes it when it then succeeds. The step
// tasks' ids are "<id>~0", "<id>~1", ...
//
// The chain's record and its first step are written in one MULTI/EXEC:
// an id in use is refused (ErrTaskExists), and after an error matching
// ErrUncertain the same call may be retried safely. A nil error means the
// chain is written; the WorkflowInfo returned is read after the write
// (only its id, kind and creation time if that read failed). More than
// 64 steps, or steps too large together, match
// ErrTooLarge.
//
// Over several lanes the workflow goes to the lane its id hashes to
// (Client.LaneOf): a workflow lives in one lane, since its steps follow each
// other in that lane's transactions.
func (c *Client) EnqueueChain(ctx context.Context, id string, steps ...Step) (*WorkflowInfo, error) {
	return c.lanes[c.LaneOf(id)].EnqueueChain(ctx, id, steps...)
}

// EnqueueGroup enqueues group g: its members, all at once, and its
// callback's template, in one MULTI/EXEC (ids in use: ErrTaskExists;
// after ErrUncertain the same call may be retried). Member i's id is
// "<g.ID>~<i>", the callback's "<g.ID>~cb". The callback is enqueued once,
// when the last member reaches a final state (done, dead or cancelled),
// by the same transaction that records that member's outcome; under
// the default (no ContinueOnFailure) only when every member is done.
//
// Over several lanes the workflow goes to the lane its id hashes to
// (Client.LaneOf): a workflow lives in one lane, since its steps follow each
// other in that lane's transactions.
func (c *Client) EnqueueGroup(ctx context.Context, g Group) (*WorkflowInfo, error) {
	return c.lanes[c.LaneOf(g.ID)].EnqueueGroup(ctx, g)
}

// Workflow reports workflow id: its steps or members with their states,
// and where it stopped. ErrNotFound when it does not exist (or its
// retention passed: it is kept for Config.DoneRetention after it ended).
func (c *Client) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	return byID(c, id, func(l *laneClient) (*WorkflowInfo, error) { return l.Workflow(ctx, id) })
}

// CancelWorkflow cancels workflow id and returns how many of its tasks it
// cancelled. A chain: its waiting step is cancelled; a step that is
// running (or dead) is marked, so that its success writes no successor.
// A group: its callback will not be enqueued, and its waiting members are
// cancelled; running ones finish. Calling it again after an error
// finishes the job. ErrAlreadyDone when the chain's last step succeeded
// or the group's callback was enqueued.
func (c *Client) CancelWorkflow(ctx context.Context, id string) (int, error) {
	return byID(c, id, func(l *laneClient) (int, error) { return l.CancelWorkflow(ctx, id) })
}

// byID runs f on id's lane, then, while it answers ErrNotFound, on the
// other lanes in order (see firstFound).
func byID[T any](c *Client, id string, f func(*laneClient) (T, error)) (T, error) {
	return firstFound(c.LaneOf(id), len(c.lanes), func(k int) (T, error) { return f(c.lanes[k]) })
}

// firstFound runs f on lane first, then, while the answer is
// ErrNotFound, on the other lanes of n in order; it returns the first
// other answer, or first's.
func firstFound[T any](first, n int, f func(k int) (T, error)) (T, error) {
	v, err := f(first)
	for k := 0; k < n && errors.Is(err, ErrNotFound); k++ {
		if k != first {
			if w, werr := f(k); !errors.Is(werr, ErrNotFound) {
				return w, werr
			}
		}
	}
	return v, err
}
