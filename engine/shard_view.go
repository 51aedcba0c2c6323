package engine

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/gomodule/redigo/redis"
)

// eachLane runs f on every lane at once and returns the lanes' errors,
// each prefixed with its lane, joined.
func eachLane[T any](n int, f func(k int) (T, error)) ([]T, []error, error) {
	if n == 1 {
		v, err := f(0)
		return []T{v}, []error{err}, err
	}
	out := make([]T, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			v, err := f(k)
			out[k] = v
			if err != nil {
				err = fmt.Errorf("lane %d: %w", k, err)
			}
			errs[k] = err
		})
	}
	wg.Wait()
	return out, errs, errors.Join(errs...)
}

// LaneStatus is one lane's health and size, as Inspector.LaneStatuses
// reads them.
type LaneStatus struct {
	Lane int `json:"lane"`
	// Prefix is the lane's key prefix ("{ns}:" or "{ns:k}:").
	Prefix string `json:"prefix"`
	// Reachable: the lane's server answered (a GET of its map key).
	Reachable bool `json:"reachable"`
	// Err says why it is not reachable, or what could not be read.
	Err string `json:"error,omitempty"`
	// RoundTrip is how long that GET took.
	RoundTrip time.Duration `json:"round_trip_ns"`
	// Role is the server's replication role from INFO: "master", or
	// "slave" for a replica (whose writes a resync would lose).
	Role string `json:"role,omitempty"`
	// MapVersion is the version of the shard map that last moved the
	// lane (its map key); 0 when it never moved.
	MapVersion int64 `json:"map_version"`
	// Sizes summed over the lane's queues.
	Ready     int64 `json:"ready"`
	Scheduled int64 `json:"scheduled"`
	Running   int64 `json:"running"`
	Dead      int64 `json:"dead"`
	// Workers counts the live worker processes registered in the lane.
	Workers int `json:"workers"`
}

// LaneStatuses reads every lane's health and size at once, each bounded
// by ctx. A lane that cannot be read is reported with Reachable false or
// Err set; the call itself fails only on a bad ctx.
func (in *Inspector) LaneStatuses(ctx context.Context) []LaneStatus {
	out, _, _ := eachLane(len(in.c.lanes), func(k int) (LaneStatus, error) {
		return in.c.laneStatus(ctx, k), nil
	})
	return out
}

func (c *Client) laneStatus(ctx context.Context, k int) LaneStatus {
	lc := c.lanes[k]
	st := LaneStatus{Lane: k, Prefix: lc.store.Keys.Prefix()}
	conn, err := lc.conn(ctx)
	if err != nil {
		st.Err = err.Error()
		return st
	}
	defer conn.Close()
	start := time.Now()
	v, err := redis.DoContext(conn, ctx, "GET", lc.store.Keys.ShardMap())
	if err != nil {
		st.Err = err.Error()
		return st
	}
	st.Reachable, st.RoundTrip = true, time.Since(start)
	if v != nil {
		s, _ := redis.String(v, nil)
		st.MapVersion, _ = strconv.ParseInt(s, 10, 64)
	}
	var errs []string
	if info, err := redis.String(redis.DoContext(conn, ctx, "INFO")); err == nil {
		st.Role, _ = redisinfo.Field(info, "role")
	} else {
		errs = append(errs, "INFO: "+err.Error())
	}
	qs, err := lc.Stats(ctx)
	if err != nil {
		errs = append(errs, err.Error())
	}
	for _, q := range qs {
		st.Ready += q.Ready
		st.Scheduled += q.Scheduled
		st.Running += q.Running
		st.Dead += q.Dead
	}
	if st.Workers, _, err = lc.LiveWorkers(ctx); err != nil {
		errs = append(errs, err.Error())
	}
	st.Err = strings.Join(errs, "; ")
	return st
}

// Queues reports every queue that was ever enqueued to, sorted by name,
// merged over the lanes: sizes and counters summed, the largest Latency,
// the earliest NextDue, Paused if paused in any lane. A queue whose
// figures cannot all be read (a key of the wrong type, a counter that is
// not a number; `engine check` finds it) is still returned with what
// could be read, and the error names what failed; a lane that cannot be
// read is left out and named in the error.
func (in *Inspector) Queues(ctx context.Context) ([]QueueInfo, error) {
	per, _, err := eachLane(len(in.c.lanes), func(k int) ([]QueueInfo, error) { return in.c.lanes[k].Stats(ctx) })
	return mergeQueues(per, func(q *QueueInfo) string { return q.Queue }, func(m, q *QueueInfo) {
		m.Ready += q.Ready
		m.Scheduled += q.Scheduled
		m.Running += q.Running
		m.Retrying += q.Retrying
		m.Dead += q.Dead
		m.Processed += q.Processed
		m.Failed += q.Failed
		m.Recovered += q.Recovered
		m.Cancelled += q.Cancelled
		m.Snoozed += q.Snoozed
		m.Expired += q.Expired
		m.Held += q.Held
		m.Latency = max(m.Latency, q.Latency)
		if !q.NextDue.IsZero() && (m.NextDue.IsZero() || q.NextDue.Before(m.NextDue)) {
			m.NextDue = q.NextDue
		}
		m.Paused = m.Paused || q.Paused
		m.MaxRunning += q.MaxRunning
		m.SlotsInUse += q.SlotsInUse
		m.KeysWaiting += q.KeysWaiting
	}), err
}

// mergeQueues merges the lanes' rows (per[k] is lane k's) by queue name:
// the first row of a name is kept and add folds each later one into it.
// The result is sorted by name.
func mergeQueues[T any](per [][]T, name func(*T) string, add func(m, q *T)) []T {
	by := map[string]*T{}
	var names []string
	for _, qs := range per {
		for i := range qs {
			q := &qs[i]
			if m := by[name(q)]; m != nil {
				add(m, q)
				continue
			}
			c := *q
			by[name(q)] = &c
			names = append(names, name(q))
		}
	}
	sort.Strings(names)
	out := make([]T, 0, len(names))
	for _, n := range names {
		out = append(out, *by[n])
	}
	return out
}

// Unserved lists the task types that waited in a queue with no worker
// serving them (see Config.UnknownType), over every lane, once per queue
// and type, with the earliest Since.
func (in *Inspector) Unserved(ctx context.Context) ([]UnservedType, error) {
	per, _, err := eachLane(len(in.c.lanes), func(k int) ([]UnservedType, error) { return in.c.lanes[k].Unserved(ctx) })
	by := map[[2]string]UnservedType{}
	for _, us := range per {
		for _, u := range us {
			k := [2]string{u.Queue, u.Type}
			if o, ok := by[k]; !ok || u.Since.Before(o.Since) {
				by[k] = u
			}
		}
	}
	out := make([]UnservedType, 0, len(by))
	for _, u := range by {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Queue < out[j].Queue || (out[i].Queue == out[j].Queue && out[i].Type < out[j].Type)
	})
	return out, err
}

// Check walks the namespace and reports inconsistencies (see CheckOptions
// and CheckReport), every lane at once: the lanes' findings together (each
// finding's Key names its lane by its hash tag) and their counts summed. A
// lane that cannot be checked is named in the error; the others are
// reported all the same.
func (in *Inspector) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	per, _, err := eachLane(len(in.c.lanes), func(k int) (*CheckReport, error) { return in.c.lanes[k].Check(ctx, opts) })
	if len(per) == 1 {
		return per[0], err
	}
	rep := &CheckReport{}
	for _, r := range per {
		if r == nil {
			continue
		}
		rep.Findings = append(rep.Findings, r.Findings...)
		rep.Unconfirmed = append(rep.Unconfirmed, r.Unconfirmed...)
		if r.Remaining != nil {
			rep.Remaining = append(rep.Remaining, r.Remaining...)
		}
		rep.InMotion += r.InMotion
		rep.Repaired += r.Repaired
		rep.Tasks += r.Tasks
		rep.Queues = max(rep.Queues, r.Queues)
	}
	return rep, err
}

// Inspector administers a namespace: its queues and their figures,
// pause and resume, listings of tasks by state (dead letters included)
// and actions on them, workers, periodic entries, workflows, and the
// consistency check. Over several lanes, calls about one task go to its
// lane and the others fan out and merge. It is safe for concurrent use.
type Inspector struct {
	c     *Client
	lanes []*laneInspector
}

// NewInspector returns an Inspector with cfg over one pool, or one pool
// per lane (as NewClient). It never closes the pools.
func NewInspector(cfg Config, pools ...*redis.Pool) (*Inspector, error) {
	c, err := NewClient(cfg, pools...)
	if err != nil {
		return nil, err
	}
	return c.inspector(), nil
}

// inspector returns the inspector of every lane.
func (c *Client) inspector() *Inspector {
	in := &Inspector{c: c}
	for _, lc := range c.lanes {
		in.lanes = append(in.lanes, lc.inspector())
	}
	return in
}

// MemoryPolicy reads the Redis server's memory limit and eviction policy
// (two CONFIG GETs): for `engine check`, /readyz and the dashboard. A
// server that refuses CONFIG gives a policy whose Unknown says so.
//
// Over several lanes it is the riskiest among the lanes' servers: one
// that evicts task records, else one that is unknown, else one that
// evicts keys with a TTL, else lane 0's.
func (in *Inspector) MemoryPolicy(ctx context.Context) (MemoryPolicy, error) {
	per, _, err := eachLane(len(in.lanes), func(k int) (MemoryPolicy, error) { return in.lanes[k].MemoryPolicy(ctx) })
	rank := func(m MemoryPolicy) int {
		switch {
		case m.Evicts():
			return 3
		case m.Unknown != "":
			return 2
		case m.MaxMemory > 0 && strings.HasPrefix(m.Policy, "volatile-"):
			return 1
		}
		return 0
	}
	var worst MemoryPolicy
	for k, m := range per {
		if k == 0 || rank(m) > rank(worst) {
			worst = m
		}
	}
	return worst, err
}

// Task looks a task up by id in any state, done and cancelled included
// (while their records are kept). It matches ErrNotFound when there is no
// such task.
//
// Over several lanes it asks the id's lane first, then the others (see
// Client.Cancel).
func (in *Inspector) Task(ctx context.Context, id string) (*TaskInfo, error) {
	return inLanes(in, id, func(l *laneInspector) (*TaskInfo, error) { return l.Task(ctx, id) })
}

// Workflow is [Client.Workflow], for `engine workflow show` and the
// dashboard.
func (in *Inspector) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	return inLanes(in, id, func(l *laneInspector) (*WorkflowInfo, error) { return l.Workflow(ctx, id) })
}

// Periodics lists the periodic entries declared in the namespace, as
// `engine periodic` shows them: schedule, next and last firing with the state
// of its task, and whether any live process declares it.
func (in *Inspector) Periodics(ctx context.Context) ([]PeriodicStatus, error) {
	return in.lanes[0].Periodics(ctx)
}

// inLanes asks id's lane first, then, while the answer is ErrNotFound,
// the others in order (see firstFound).
func inLanes[T any](in *Inspector, id string, f func(*laneInspector) (*T, error)) (*T, error) {
	return firstFound(in.c.LaneOf(id), len(in.lanes), func(k int) (*T, error) { return f(in.lanes[k]) })
}

// Workers lists every registered worker process, sorted by id, read in
// one MULTI/EXEC (five commands per worker, whatever it runs).
// A process serving several lanes is listed once per lane.
func (in *Inspector) Workers(ctx context.Context) ([]WorkerInfo, error) {
	per, _, err := eachLane(len(in.lanes), func(k int) ([]WorkerInfo, error) { return in.lanes[k].Workers(ctx) })
	var out []WorkerInfo
	for _, ws := range per {
		out = append(out, ws...)
	}
	return out, err
}

// Act applies action a to the tasks ids, in batches of 100,
// each one optimistic transaction that reads the tasks again under WATCH
// and applies the action only where it still applies. It returns what it
// did, also when it fails part way (the batches before the error were
// applied).
//
// Over several lanes each id goes to its lane, and an id its lane does
// not hold is looked for in the others (a workflow's steps live in the
// workflow's lane, which their ids do not name); that costs a read per
// lane for each such id.
func (in *Inspector) Act(ctx context.Context, a Action, ids ...string) (ActionResult, error) {
	byLane := map[int][]string{}
	for _, id := range ids {
		k := in.c.LaneOf(id)
		byLane[k] = append(byLane[k], id)
	}
	per, _, err := eachLane(len(in.lanes), func(k int) (ActionResult, error) {
		if len(byLane[k]) == 0 {
			return ActionResult{}, nil
		}
		return in.lanes[k].Act(ctx, a, byLane[k]...)
	})
	res := sumActions(per)
	if err != nil || res.Missing == 0 {
		return res, err
	}
	for k, lane := range byLane {
		if per[k].Missing == 0 {
			continue
		}
		for _, id := range lane {
			if _, err := in.lanes[k].Task(ctx, id); !errors.Is(err, ErrNotFound) {
				if err != nil {
					return res, fmt.Errorf("lane %d: %w", k, err)
				}
				continue // its lane holds it: acted on or skipped there
			}
			for j := range in.lanes {
				if j == k {
					continue
				}
				if _, err := in.lanes[j].Task(ctx, id); errors.Is(err, ErrNotFound) {
					continue
				} else if err != nil {
					return res, fmt.Errorf("lane %d: %w", j, err)
				}
				r, err := in.lanes[j].Act(ctx, a, id)
				if err != nil {
					return res, fmt.Errorf("lane %d: %w", j, err)
				}
				res.Done += r.Done
				res.Skipped += r.Skipped
				res.Missing += r.Missing - 1
				break
			}
		}
	}
	return res, nil
}

// ActAll applies action a to every task the filter names: it walks the
// listing a page of 100 at a time and acts on each page in one
// optimistic transaction, which applies the action only to the tasks
// still in the filter's state. Tasks that enter the state while it runs
// may or may not be included. It returns what it did, also when it fails
// part way.
func (in *Inspector) ActAll(ctx context.Context, a Action, f Filter) (ActionResult, error) {
	per, _, err := eachLane(len(in.lanes), func(k int) (ActionResult, error) { return in.lanes[k].ActAll(ctx, a, f) })
	return sumActions(per), err
}

func sumActions(per []ActionResult) ActionResult {
	var r ActionResult
	for _, p := range per {
		r.Done += p.Done
		r.Skipped += p.Skipped
		r.Missing += p.Missing
	}
	return r
}

// PauseQueue pauses queue q: workers take no task from it until
// ResumeQueue; running tasks finish, and tasks keep being enqueued and
// dispatched to it. Over several lanes, on an error some lanes may be
// paused and others not: call it again.
func (in *Inspector) PauseQueue(ctx context.Context, q string) error {
	_, _, err := eachLane(len(in.c.lanes), func(k int) (struct{}, error) { return struct{}{}, in.c.lanes[k].PauseQueue(ctx, q) })
	return err
}

// SetQueueLimits sets the flow control of queue qc.Name to qc's
// MaxRunning, Rate, KeyMaxRunning and KeyRate, all at once (a zero field
// removes that limit; Weight is not stored). Workers apply a change
// within a second; tasks running over a lowered limit finish. Over
// several lanes each lane has its own limits, slots and windows, and
// this sets them all.
func (in *Inspector) SetQueueLimits(ctx context.Context, qc QueueConfig) error {
	_, _, err := eachLane(len(in.c.lanes), func(k int) (struct{}, error) {
		return struct{}{}, in.c.lanes[k].SetQueueLimits(ctx, qc)
	})
	return err
}

// Keys lists up to n keys of queue q that have tasks waiting, the next
// in turn first, with each key's waiting tasks and slots in use: one
// row per key whatever its number of tasks, so that a tenant's backlog
// is seen without a series per key. Over several lanes each lane's rows
// come in turn, merged by key.
func (in *Inspector) Keys(ctx context.Context, q string, n int) ([]KeyInfo, error) {
	per, _, err := eachLane(len(in.c.lanes), func(k int) ([]KeyInfo, error) { return in.c.lanes[k].Keys(ctx, q, n) })
	out := mergeQueues(per, func(k *KeyInfo) string { return k.Key }, func(m, k *KeyInfo) {
		m.Waiting += k.Waiting
		m.Running += k.Running
		if k.Next.Before(m.Next) {
			m.Next = k.Next
		}
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Next.Before(out[j].Next) })
	if len(out) > n {
		out = out[:n]
	}
	return out, err
}

// ResumeQueue resumes queue q in every lane.
func (in *Inspector) ResumeQueue(ctx context.Context, q string) error {
	_, _, err := eachLane(len(in.c.lanes), func(k int) (struct{}, error) { return struct{}{}, in.c.lanes[k].ResumeQueue(ctx, q) })
	return err
}

// shardCursor resumes a sharded listing: the lane reached and that lane's
// own cursor.
type shardCursor struct {
	Lane int    `json:"l"`
	Next string `json:"n,omitempty"`
}

// ListTasks lists one page of the tasks of a queue in a state, in the
// order they will be taken: scheduled and retrying in due order (bucket
// by bucket, then in each bucket's order), ready in pop order, running by
// worker then lease deadline, dead newest first.
//
// Each page costs a fixed number of commands (at most a few plus one per
// bucket or worker it visits, never more than Limit of those) and reads at
// most Limit entries, or searchScan when it must judge entries by their
// records; the page's entries are read in one MULTI/EXEC where they come
// from one list. With MaxBytes their records are read 16 to a command
// until that many bytes were read. Paging while tasks move returns no task twice and skips
// none that stayed in its state, as long as fewer than about a thousand
// tasks left a list ahead of the page between two calls; a task that
// leaves its state and comes back (a retry, a recovery) may be listed
// again.
//
// Over several lanes a page holds tasks of one lane, and its Next goes
// on in that lane, then in the next; Total is the sum over every lane.
func (in *Inspector) ListTasks(ctx context.Context, opts ListOptions) (*TaskPage, error) {
	var cur shardCursor
	if opts.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(opts.Cursor)
		if err == nil {
			err = json.Unmarshal(b, &cur)
		}
		if err != nil || cur.Lane < 0 || cur.Lane >= len(in.lanes) {
			return nil, fmt.Errorf("engine: list cursor %q: not one of a sharded listing: %w", opts.Cursor, ErrInvalid)
		}
	}
	lo := opts
	lo.Cursor = cur.Next
	page, err := in.lanes[cur.Lane].ListTasks(ctx, lo)
	if err != nil {
		if len(in.lanes) > 1 {
			err = fmt.Errorf("lane %d: %w", cur.Lane, err)
		}
		return nil, err
	}
	// The total of every lane: the other lanes' gauges.
	totals, _, terr := eachLane(len(in.lanes), func(k int) (int64, error) {
		if k == cur.Lane {
			return page.Total, nil
		}
		p, err := in.lanes[k].ListTasks(ctx, ListOptions{Filter: Filter{Queue: opts.Queue, State: opts.State, Priority: opts.Priority}, Limit: 1, MaxBytes: 1})
		if err != nil {
			return 0, err
		}
		return p.Total, nil
	})
	if terr != nil {
		return nil, terr
	}
	out := &TaskPage{Tasks: page.Tasks, BytesRead: page.BytesRead}
	for _, n := range totals {
		out.Total += n
	}
	next := shardCursor{Lane: cur.Lane, Next: page.Next}
	if page.Next == "" {
		next = shardCursor{Lane: cur.Lane + 1}
	}
	if next.Lane < len(in.lanes) {
		b, _ := json.Marshal(next)
		out.Next = base64.RawURLEncoding.EncodeToString(b)
	}
	return out, nil
}
