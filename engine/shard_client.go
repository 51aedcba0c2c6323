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
)

// ShardedClient is a Client over the lanes of Shards: it routes each call
// to the lane that holds the task, and fans the namespace-wide calls out
// over every lane. It is safe for concurrent use and never closes the
// pools it is given.
//
// Routing: a task's lane is part of its id (LaneOf), so Lookup, Cancel,
// Wait, Result and the dead-letter calls go straight to it. A task with a
// TaskID goes to its id's lane and one with a unique key (Unique,
// UniqueKey) to the lane its key hashes to, so that the check for an
// existing id or holder and the write are one transaction on one server;
// the two must agree when a task has both. A task with ShardKey goes to
// the key's lane; any other task to the next lane, round-robin.
//
// Fallback: when a lane's server cannot be reached (or refuses writes
// under another shard-map version), a task without a TaskID or unique key
// is written to another lane instead, and gets an id of that lane; this
// is counted (Rerouted) and logged. Such a lane is then avoided by the
// round-robin for a backoff that doubles from 100 ms to 5 s while its
// failures continue. A failure after the write was sent (ErrUncertain) is
// returned, never rerouted: the task may have been written.
type ShardedClient struct {
	lanes []*Client
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

// NewShardedClient returns a client over the lanes of sh with cfg (zero
// fields take their defaults). With one lane it writes the same keys and
// ids as NewClient.
func NewShardedClient(sh Shards, cfg Config) (*ShardedClient, error) {
	if err := sh.check(); err != nil {
		return nil, err
	}
	c := &ShardedClient{health: make([]laneHealth, len(sh.Pools))}
	for k, p := range sh.Pools {
		lc, err := NewClient(p, sh.laneConfig(cfg, k))
		if err != nil {
			return nil, err
		}
		c.lanes = append(c.lanes, lc)
	}
	c.cfg = c.lanes[0].cfg
	return c, nil
}

// Lanes is the number of lanes.
func (c *ShardedClient) Lanes() int { return len(c.lanes) }

// Lane returns the Client of lane k (0 <= k < Lanes()).
func (c *ShardedClient) Lane(k int) *Client { return c.lanes[k] }

// LaneOf returns the lane of task id (see the package function LaneOf).
func (c *ShardedClient) LaneOf(id string) int { return LaneOf(id, len(c.lanes)) }

// Rerouted counts the tasks written to another lane than the one first
// chosen because that lane could not be reached.
func (c *ShardedClient) Rerouted() int64 { return c.rerouted.Load() }

// Enqueue adds a task due now, in its lane (see ShardedClient), as
// Client.Enqueue does.
func (c *ShardedClient) Enqueue(ctx context.Context, typ string, payload []byte, opts ...Option) (*TaskInfo, error) {
	res, err := c.EnqueueBatch(ctx, []NewTask{{Type: typ, Payload: payload, Options: opts}})
	if res == nil {
		return nil, err
	}
	if res.Errs[0] != nil {
		return nil, res.Errs[0]
	}
	return res.Tasks[0], nil
}

// BatchResult says where each task of a sharded EnqueueBatch went.
type BatchResult struct {
	// Tasks holds what was written, in the order given; nil for a task
	// whose lane failed.
	Tasks []*TaskInfo
	// Lanes holds the lane each task was written to (or last tried).
	Lanes []int
	// Errs holds, per task, nil when it was written, else its lane's
	// error (the same error for every task of that lane).
	Errs []error
}

// Written counts the tasks written.
func (r *BatchResult) Written() int {
	n := 0
	for _, t := range r.Tasks {
		if t != nil {
			n++
		}
	}
	return n
}

// EnqueueBatch adds many tasks, one transaction per lane: each lane's
// tasks are all written or (with an error) none, and the lanes are
// written at once. Every task is checked before anything is sent; a bad
// task fails the whole call with nothing written (a nil result). Then the
// result says where each task went; the error joins the lanes' errors
// (nil when every task was written). Tasks that may move (without TaskID
// or unique key) of a lane that cannot be reached are written to another
// lane instead, all together.
func (c *ShardedClient) EnqueueBatch(ctx context.Context, tasks []NewTask) (*BatchResult, error) {
	n := len(c.lanes)
	now := c.cfg.Advanced.Clock.Now()
	recs := make([]*buckets.Record, len(tasks))
	chosen := make([]bool, len(tasks))
	movable := make([]bool, len(tasks))
	res := &BatchResult{Tasks: make([]*TaskInfo, len(tasks)), Lanes: make([]int, len(tasks)), Errs: make([]error, len(tasks))}
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
				return nil, fmt.Errorf("engine: tasks %d and %d both have id %q: %w", j, i, r.ID, ErrInvalidID)
			}
			ids[r.ID] = i
		} else {
			r.ID = laneTaskID(res.Lanes[i], n, r.Created)
		}
		recs[i], chosen[i] = r, mine
	}
	if len(recs) > 1 {
		if err := checkWriteBytes(ErrPayloadTooLarge, fmt.Sprintf("batch of %d tasks", len(recs)), recs); err != nil {
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
	var errs []error
	seen := map[error]bool{}
	for _, e := range res.Errs {
		if e != nil && !seen[e] {
			seen[e] = true
			errs = append(errs, e)
		}
	}
	return res, errors.Join(errs...)
}

// writeLane writes the tasks idx of recs to lane k in one transaction.
func (c *ShardedClient) writeLane(ctx context.Context, k int, now time.Time, recs []*buckets.Record, chosen []bool, idx []int, res *BatchResult) error {
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
		errors.Is(err, ErrInvalidOption), errors.Is(err, ErrInvalidName), errors.Is(err, ErrPayloadTooLarge),
		errors.Is(err, context.Canceled):
		return false
	}
	return true
}

// route picks the lane of a new task; movable says whether it may go to
// another lane when that one cannot be reached.
func (c *ShardedClient) route(r *buckets.Record, mine bool, opts []Option, now time.Time) (lane int, movable bool, err error) {
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
		rules = append(rules, rule{"task id", LaneOf(r.ID, n)})
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
				rules[0].what, rules[0].lane, x.what, x.lane, x.lane, ErrInvalidOption)
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
func (c *ShardedClient) pick(now time.Time, skip map[int]bool) int {
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

// Cancel cancels a task that has not started, in its lane, as
// Client.Cancel does. Like every call by id below, it asks the id's lane
// first and, while the answer is ErrNotFound, the other lanes: the steps
// of a workflow ("<workflow>~<i>") live in the workflow's lane, which
// their ids do not name.
func (c *ShardedClient) Cancel(ctx context.Context, id string) error {
	_, err := byID(c, id, func(l *Client) (struct{}, error) { return struct{}{}, l.Cancel(ctx, id) })
	return err
}

// Lookup reports a task's state from its lane, as Client.Lookup does.
func (c *ShardedClient) Lookup(ctx context.Context, id string) (*TaskInfo, error) {
	return byID(c, id, func(l *Client) (*TaskInfo, error) { return l.Lookup(ctx, id) })
}

// Wait waits for a task's outcome in its lane, as Client.Wait does.
func (c *ShardedClient) Wait(ctx context.Context, id string) (*Outcome, error) {
	return byID(c, id, func(l *Client) (*Outcome, error) { return l.Wait(ctx, id) })
}

// Result returns a task's result from its lane, as Client.Result does.
func (c *ShardedClient) Result(ctx context.Context, id string) ([]byte, error) {
	return byID(c, id, func(l *Client) ([]byte, error) { return l.Result(ctx, id) })
}

// RetryDead retries a dead letter in its lane, as Client.RetryDead does.
func (c *ShardedClient) RetryDead(ctx context.Context, id string) error {
	_, err := byID(c, id, func(l *Client) (struct{}, error) { return struct{}{}, l.RetryDead(ctx, id) })
	return err
}

// PurgeDead deletes a dead letter in its lane, as Client.PurgeDead does.
func (c *ShardedClient) PurgeDead(ctx context.Context, id string) error {
	_, err := byID(c, id, func(l *Client) (struct{}, error) { return struct{}{}, l.PurgeDead(ctx, id) })
	return err
}

// EnqueueChain enqueues a chain (see Client.EnqueueChain) in the lane its
// id hashes to (LaneOf): a workflow lives in one lane, since its steps
// follow each other in that lane's transactions.
func (c *ShardedClient) EnqueueChain(ctx context.Context, id string, steps ...Step) (*WorkflowInfo, error) {
	return c.lanes[c.LaneOf(id)].EnqueueChain(ctx, id, steps...)
}

// EnqueueGroup enqueues a group (see Client.EnqueueGroup) in the lane its
// id hashes to, as EnqueueChain does.
func (c *ShardedClient) EnqueueGroup(ctx context.Context, g Group) (*WorkflowInfo, error) {
	return c.lanes[c.LaneOf(g.ID)].EnqueueGroup(ctx, g)
}

// Workflow reports a workflow from its lane (see Client.Workflow).
func (c *ShardedClient) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	return byID(c, id, func(l *Client) (*WorkflowInfo, error) { return l.Workflow(ctx, id) })
}

// CancelWorkflow cancels a workflow in its lane (see Client.CancelWorkflow).
func (c *ShardedClient) CancelWorkflow(ctx context.Context, id string) (int, error) {
	return byID(c, id, func(l *Client) (int, error) { return l.CancelWorkflow(ctx, id) })
}

// byID runs f on id's lane, then, while it answers ErrNotFound, on the
// other lanes in order (see firstFound).
func byID[T any](c *ShardedClient, id string, f func(*Client) (T, error)) (T, error) {
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
