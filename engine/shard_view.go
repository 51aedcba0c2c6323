package engine

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// eachLane runs f on every lane at once and returns the lanes' errors,
// each prefixed with its lane, joined.
func eachLane[T any](n int, f func(k int) (T, error)) ([]T, []error, error) {
	out := make([]T, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			v, err := f(k)
			out[k] = v
			if err != nil {
				errs[k] = fmt.Errorf("lane %d: %w", k, err)
			}
		})
	}
	wg.Wait()
	return out, errs, errors.Join(errs...)
}

// LaneStatus is one lane's health and size, as
// ShardedClient.LaneStatuses reads them.
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
func (c *ShardedClient) LaneStatuses(ctx context.Context) []LaneStatus {
	out, _, _ := eachLane(len(c.lanes), func(k int) (LaneStatus, error) {
		return c.laneStatus(ctx, k), nil
	})
	return out
}

func (c *ShardedClient) laneStatus(ctx context.Context, k int) LaneStatus {
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
		for _, line := range strings.Split(info, "\n") {
			if r, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
				st.Role = r
			}
		}
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

// Stats reports every queue of every lane, merged by name: sizes and
// counters summed, the oldest ready age the largest, NextDue the
// earliest, Paused if paused in any lane. A lane that cannot be read is
// left out and named in the error (its figures are missing from the
// sums); the others are returned all the same.
func (c *ShardedClient) Stats(ctx context.Context) ([]QueueStats, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) ([]QueueStats, error) { return c.lanes[k].Stats(ctx) })
	return mergeQueues(per, func(q *QueueStats) string { return q.Queue }, func(m, q *QueueStats) {
		m.Ready += q.Ready
		m.Scheduled += q.Scheduled
		m.Running += q.Running
		m.Retrying += q.Retrying
		m.Dead += q.Dead
		m.Processed += q.Processed
		m.Failed += q.Failed
		m.Recovered += q.Recovered
		m.Cancelled += q.Cancelled
		m.OldestReadyAge = max(m.OldestReadyAge, q.OldestReadyAge)
		if !q.NextDue.IsZero() && (m.NextDue.IsZero() || q.NextDue.Before(m.NextDue)) {
			m.NextDue = q.NextDue
		}
		m.Paused = m.Paused || q.Paused
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

// DeadCount sums the dead letters of every lane.
func (c *ShardedClient) DeadCount(ctx context.Context) (int, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) (int, error) { return c.lanes[k].DeadCount(ctx) })
	n := 0
	for _, v := range per {
		n += v
	}
	return n, err
}

// LiveWorkers sums the live and registered worker processes of every
// lane (a process serving several lanes counts once per lane).
func (c *ShardedClient) LiveWorkers(ctx context.Context) (alive, registered int, err error) {
	type ar struct{ a, r int }
	per, _, err := eachLane(len(c.lanes), func(k int) (ar, error) {
		a, r, err := c.lanes[k].LiveWorkers(ctx)
		return ar{a, r}, err
	})
	for _, v := range per {
		alive += v.a
		registered += v.r
	}
	return alive, registered, err
}

// PauseQueue pauses queue q in every lane (see Client.PauseQueue). On an
// error some lanes may be paused and others not: call it again.
func (c *ShardedClient) PauseQueue(ctx context.Context, q string) error {
	_, _, err := eachLane(len(c.lanes), func(k int) (struct{}, error) { return struct{}{}, c.lanes[k].PauseQueue(ctx, q) })
	return err
}

// ResumeQueue resumes queue q in every lane (see Client.ResumeQueue).
func (c *ShardedClient) ResumeQueue(ctx context.Context, q string) error {
	_, _, err := eachLane(len(c.lanes), func(k int) (struct{}, error) { return struct{}{}, c.lanes[k].ResumeQueue(ctx, q) })
	return err
}

// Paused lists the queues paused in any lane, sorted.
func (c *ShardedClient) Paused(ctx context.Context) ([]string, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) ([]string, error) { return c.lanes[k].Paused(ctx) })
	set := map[string]bool{}
	for _, qs := range per {
		for _, q := range qs {
			set[q] = true
		}
	}
	out := make([]string, 0, len(set))
	for q := range set {
		out = append(out, q)
	}
	sort.Strings(out)
	return out, err
}

// Unserved lists the unserved task types of every lane (see
// Client.Unserved), once per queue and type, with the earliest Since.
func (c *ShardedClient) Unserved(ctx context.Context) ([]UnservedType, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) ([]UnservedType, error) { return c.lanes[k].Unserved(ctx) })
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

// RetryAllDead retries the dead letters of every lane.
func (c *ShardedClient) RetryAllDead(ctx context.Context) (int, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) (int, error) { return c.lanes[k].RetryAllDead(ctx) })
	n := 0
	for _, v := range per {
		n += v
	}
	return n, err
}

// LaneCheck is one lane's part of a sharded check.
type LaneCheck struct {
	Lane   int
	Report *CheckReport // nil when the lane could not be checked
	Err    error
}

// ShardedCheckReport is a check of every lane: the lanes' findings
// together (each finding's Key names its lane by its hash tag), their
// counts summed, and each lane's own report.
type ShardedCheckReport struct {
	CheckReport
	Lanes []LaneCheck
}

// Check checks every lane at once (see Client.Check). A lane that cannot
// be checked has its Err set and is named in the error; the others are
// reported all the same.
func (c *ShardedClient) Check(ctx context.Context, opts CheckOptions) (*ShardedCheckReport, error) {
	per, errs, err := eachLane(len(c.lanes), func(k int) (*CheckReport, error) { return c.lanes[k].Check(ctx, opts) })
	rep := &ShardedCheckReport{}
	for k, r := range per {
		rep.Lanes = append(rep.Lanes, LaneCheck{Lane: k, Report: r, Err: errs[k]})
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

// ShardedInspector is the Inspector of every lane: calls about one task
// go to its lane, the others fan out and merge.
type ShardedInspector struct {
	c     *ShardedClient
	lanes []*Inspector
}

// Inspector returns the inspector of every lane.
func (c *ShardedClient) Inspector() *ShardedInspector {
	in := &ShardedInspector{c: c}
	for _, lc := range c.lanes {
		in.lanes = append(in.lanes, lc.Inspector())
	}
	return in
}

// MemoryPolicy is the riskiest memory policy among the lanes' servers:
// one that evicts task records, else one that is unknown, else one that
// evicts keys with a TTL, else lane 0's. A lane that cannot be read is
// named in the error.
func (in *ShardedInspector) MemoryPolicy(ctx context.Context) (MemoryPolicy, error) {
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

// Lane returns lane k's Inspector.
func (in *ShardedInspector) Lane(k int) *Inspector { return in.lanes[k] }

// Queues reports every queue of every lane merged by name (sums; the
// largest latency; paused if paused in any lane). A lane that cannot be
// read is left out and named in the error.
func (in *ShardedInspector) Queues(ctx context.Context) ([]QueueInfo, error) {
	per, _, err := eachLane(len(in.lanes), func(k int) ([]QueueInfo, error) { return in.lanes[k].Queues(ctx) })
	return mergeQueues(per, func(q *QueueInfo) string { return q.Queue }, func(m, q *QueueInfo) {
		m.Scheduled += q.Scheduled
		m.Ready += q.Ready
		m.Running += q.Running
		m.Retrying += q.Retrying
		m.Dead += q.Dead
		m.Processed += q.Processed
		m.Failed += q.Failed
		m.Recovered += q.Recovered
		m.Cancelled += q.Cancelled
		m.Latency = max(m.Latency, q.Latency)
		m.Paused = m.Paused || q.Paused
	}), err
}

// Task reports one task from its lane (see Inspector.Task). An id its
// lane does not hold is looked for in the other lanes: a workflow's steps
// ("<workflow>~<i>") live in the lane the workflow was enqueued to, which
// their ids do not name.
func (in *ShardedInspector) Task(ctx context.Context, id string) (*TaskView, error) {
	return inLanes(in, id, func(l *Inspector) (*TaskView, error) { return l.Task(ctx, id) })
}

// Workflow reports workflow id from the lane that holds it (see
// Inspector.Workflow), looked for as Task looks for a task.
func (in *ShardedInspector) Workflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	return inLanes(in, id, func(l *Inspector) (*WorkflowInfo, error) { return l.Workflow(ctx, id) })
}

// Result reports a done task's result from its lane (see Client.Result).
func (in *ShardedInspector) Result(ctx context.Context, id string) ([]byte, error) {
	return in.lanes[in.c.LaneOf(id)].Result(ctx, id)
}

// Periodics reports the periodic entries, which live in lane 0.
func (in *ShardedInspector) Periodics(ctx context.Context) ([]PeriodicStatus, error) {
	return in.lanes[0].Periodics(ctx)
}

// inLanes asks id's lane first, then, while the answer is ErrNotFound,
// the others in order (see firstFound).
func inLanes[T any](in *ShardedInspector, id string, f func(*Inspector) (*T, error)) (*T, error) {
	return firstFound(in.c.LaneOf(id), len(in.lanes), func(k int) (*T, error) { return f(in.lanes[k]) })
}

// Workers lists the worker processes of every lane; a process serving
// several lanes is listed once per lane (under one id per lane).
func (in *ShardedInspector) Workers(ctx context.Context) ([]WorkerInfo, error) {
	per, _, err := eachLane(len(in.lanes), func(k int) ([]WorkerInfo, error) { return in.lanes[k].Workers(ctx) })
	var out []WorkerInfo
	for _, ws := range per {
		out = append(out, ws...)
	}
	return out, err
}

// Act applies a to the tasks ids, each in its lane (see Inspector.Act);
// the counts are summed. An id its lane does not hold is looked for in
// the other lanes, as Task looks (a workflow's steps live in the
// workflow's lane, which their ids do not name), and acted on where it
// is found; that costs a read per lane for each such id, and nothing
// while every id is where it names.
func (in *ShardedInspector) Act(ctx context.Context, a Action, ids ...string) (ActionResult, error) {
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

// ActAll applies a to the tasks matching f in every lane (see
// Inspector.ActAll); the counts are summed.
func (in *ShardedInspector) ActAll(ctx context.Context, a Action, f Filter) (ActionResult, error) {
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

// PauseQueue pauses q in every lane.
func (in *ShardedInspector) PauseQueue(ctx context.Context, q string) error {
	return in.c.PauseQueue(ctx, q)
}

// ResumeQueue resumes q in every lane.
func (in *ShardedInspector) ResumeQueue(ctx context.Context, q string) error {
	return in.c.ResumeQueue(ctx, q)
}

// shardCursor resumes a sharded listing: the lane reached and that lane's
// own cursor.
type shardCursor struct {
	Lane int    `json:"l"`
	Next string `json:"n,omitempty"`
}

// ListTasks lists the tasks of a filter lane after lane (see
// Inspector.ListTasks): a page holds tasks of one lane, and its Next goes
// on in that lane, then in the next. Total is the sum over every lane, as
// of this page's read.
func (in *ShardedInspector) ListTasks(ctx context.Context, opts ListOptions) (*TaskPage, error) {
	var cur shardCursor
	if opts.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(opts.Cursor)
		if err == nil {
			err = json.Unmarshal(b, &cur)
		}
		if err != nil || cur.Lane < 0 || cur.Lane >= len(in.lanes) {
			return nil, fmt.Errorf("engine: list cursor %q: not one of a sharded listing: %w", opts.Cursor, ErrInvalidOption)
		}
	}
	lo := opts
	lo.Cursor = cur.Next
	page, err := in.lanes[cur.Lane].ListTasks(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("lane %d: %w", cur.Lane, err)
	}
	// The total of every lane: the other lanes' gauges.
	totals, _, terr := eachLane(len(in.lanes), func(k int) (int64, error) {
		if k == cur.Lane {
			return page.Total, nil
		}
		p, err := in.lanes[k].ListTasks(ctx, ListOptions{Filter: Filter{Queue: opts.Queue, State: opts.State}, Limit: 1, MaxBytes: 1})
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

// DeadLetters lists the dead letters of every lane, newest first (see
// Client.DeadLetters): count of them from offset in that merged order.
// Each lane reads its newest offset+count, so a deep offset costs
// offset+count reads per lane. A lane that cannot be read fails the call.
func (c *ShardedClient) DeadLetters(ctx context.Context, offset, count int) ([]*TaskInfo, error) {
	if offset < 0 || count < 1 {
		return nil, fmt.Errorf("engine: DeadLetters(%d, %d): %w", offset, count, ErrInvalidOption)
	}
	per, _, err := eachLane(len(c.lanes), func(k int) ([]*TaskInfo, error) { return c.lanes[k].DeadLetters(ctx, 0, offset+count) })
	if err != nil {
		return nil, err
	}
	var all []*TaskInfo
	for _, ts := range per {
		all = append(all, ts...)
	}
	slices.SortStableFunc(all, func(a, b *TaskInfo) int { return b.Finished.Compare(a.Finished) })
	if offset >= len(all) {
		return []*TaskInfo{}, nil
	}
	return all[offset:min(len(all), offset+count)], nil
}

// PurgeAllDead deletes the dead letters of every lane (see
// Client.PurgeAllDead) and returns how many.
func (c *ShardedClient) PurgeAllDead(ctx context.Context) (int, error) {
	per, _, err := eachLane(len(c.lanes), func(k int) (int, error) { return c.lanes[k].PurgeAllDead(ctx) })
	n := 0
	for _, v := range per {
		n += v
	}
	return n, err
}
