package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Inspector reads and steers the tasks, queues and workers of one
// namespace: the library behind `engine tasks`, `engine queues`,
// `engine workers` and the dashboard. Every call is bounded: a listing
// reads at most a fixed number of commands and elements per page whatever
// the number of tasks, and a bulk action works in batches of at most
// 100 tasks, each one optimistic transaction. It is safe for
// concurrent use and never closes the pool it is given.
type laneInspector struct {
	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
}

// NewInspector returns an Inspector over pool for cfg's namespace (zero
// fields take their defaults); it reports a bad cfg.
func newLaneInspector(pool *redis.Pool, cfg Config) (*laneInspector, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewInspector: nil pool: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	return &laneInspector{pool: pool, cfg: cfg, store: st}, nil
}

// Inspector returns an Inspector sharing the Client's pool and Config.
func (c *laneClient) inspector() *laneInspector {
	return &laneInspector{pool: c.pool, cfg: c.cfg, store: c.store}
}

// client is a Client over the Inspector's pool and namespace, for the
// calls both offer.
func (in *laneInspector) client() *laneClient {
	return &laneClient{pool: in.pool, cfg: in.cfg, store: in.store}
}

// Result is [Client.Result], for the dashboard's task page.
func (in *laneInspector) Result(ctx context.Context, id string) ([]byte, error) {
	return in.client().Result(ctx, id)
}

// Periodics is Inspector.Periodics for one lane.
func (in *laneInspector) Periodics(ctx context.Context) ([]PeriodicStatus, error) {
	return in.client().Periodics(ctx)
}

// PauseQueue and ResumeQueue are Inspector.PauseQueue and ResumeQueue
// for one lane.
func (in *laneInspector) PauseQueue(ctx context.Context, q string) error {
	return in.client().PauseQueue(ctx, q)
}

// ResumeQueue: see PauseQueue.
func (in *laneInspector) ResumeQueue(ctx context.Context, q string) error {
	return in.client().ResumeQueue(ctx, q)
}

func (in *laneInspector) conn(ctx context.Context) (redis.Conn, error) {
	conn, err := in.pool.GetContext(ctx)
	if err != nil {
		return nil, failed("get a connection", err)
	}
	return conn, nil
}

// QueueInfo is one queue's figures, as Inspector.Queues reads them.
type QueueInfo struct {
	Queue string `json:"queue"`
	// Sizes by state, which are disjoint: Scheduled counts the tasks
	// waiting in the queue's buckets for their first attempt, Retrying the
	// failed ones waiting there for their next attempt; a task due (a
	// retry included) is Ready until a worker takes it.
	Scheduled int64 `json:"scheduled"`
	Ready     int64 `json:"ready"`
	Running   int64 `json:"running"`
	Retrying  int64 `json:"retrying"`
	Dead      int64 `json:"dead"`
	// Totals since the queue was first used.
	Processed int64 `json:"processed"`
	Failed    int64 `json:"failed"` // handler runs that failed
	Recovered int64 `json:"recovered"`
	Cancelled int64 `json:"cancelled"`
	Snoozed   int64 `json:"snoozed"` // runs whose handler snoozed its task
	Expired   int64 `json:"expired"` // tasks buried as not started by their expiry (ExpireIn)
	// Held counts the claims that gave a task back because a limit of
	// its queue or key was reached (a slot in use, a window full): how
	// often tasks waited for flow control.
	Held int64 `json:"held"`
	// Latency is the age of the oldest ready task: how long the task a
	// worker takes next has been due. Zero when none is ready.
	Latency time.Duration `json:"latency_ns"`
	// NextDue is the earliest bucket's time; zero when none is scheduled.
	NextDue time.Time `json:"next_due"`
	// Paused reports whether the queue is paused (Inspector.PauseQueue).
	Paused bool `json:"paused"`
	// MaxRunning is the queue's concurrency limit (0: none) and
	// SlotsInUse how many of its slots running tasks hold
	// (Inspector.SetQueueLimits); over several lanes, their sums.
	MaxRunning int64 `json:"max_running"`
	SlotsInUse int64 `json:"slots_in_use"`
	// Rate, KeyMaxRunning and KeyRate are the rest of its flow control
	// (QueueConfig; "" and 0: none), and KeysWaiting how many keys have
	// tasks waiting (the Key option; those tasks are not in Ready); over
	// several lanes, the first lane's limits and the sum of the keys.
	Rate          string `json:"rate,omitempty"`
	KeyMaxRunning int64  `json:"key_max_running"`
	KeyRate       string `json:"key_rate,omitempty"`
	KeysWaiting   int64  `json:"keys_waiting"`
}

// setFlow sets q's flow-control figures from a queue's snapshot.
func (q *QueueInfo) setFlow(s buckets.QueueSnapshot) {
	q.Held = s.Held
	q.MaxRunning, q.SlotsInUse = s.Limits.MaxRunning, s.SlotsInUse
	q.Rate, q.KeyMaxRunning, q.KeyRate = s.Limits.Rate.String(), s.Limits.KeyMaxRunning, s.Limits.KeyRate.String()
	q.KeysWaiting = s.KeysWaiting
}

// Queues reports every queue that was ever enqueued to, sorted by name:
// the paused set (SMEMBERS), then every queue's figures read in one
// MULTI/EXEC (three commands per queue), then the oldest
// ready records in one MGET. A queue whose figures cannot all be read (a
// key of the wrong type) is still returned, with what could be read, and
// the error names it.
func (in *laneInspector) Queues(ctx context.Context) ([]QueueInfo, error) {
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	names, err := in.store.QueueNames(ctx, conn)
	if err != nil {
		return nil, failed("list queues", err)
	}
	return in.queues(ctx, conn, names)
}

// Queue reports one queue's figures, as Queues does.
func (in *laneInspector) Queue(ctx context.Context, name string) (*QueueInfo, error) {
	if err := validateQueue(name); err != nil {
		return nil, err
	}
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	qs, err := in.queues(ctx, conn, []string{name})
	if len(qs) != 1 {
		return nil, err
	}
	return &qs[0], err
}

func (in *laneInspector) queues(ctx context.Context, conn redis.Conn, names []string) ([]QueueInfo, error) {
	pausedQs, err := in.store.PausedQueues(ctx, conn)
	if err != nil {
		return nil, failed("read queues", err)
	}
	snap, err := in.store.Snapshot(ctx, conn, names)
	if err != nil {
		return nil, failed("read queues", err)
	}
	var ids []string
	var at []int
	out := make([]QueueInfo, len(snap))
	var errs []error
	for i, s := range snap {
		out[i] = QueueInfo{Queue: s.Queue, Scheduled: s.Scheduled, Ready: s.Ready, Running: s.Running,
			Retrying: s.Retrying, Dead: s.Dead, Processed: s.Processed, Failed: s.Failed,
			Recovered: s.Recovered, Cancelled: s.Cancelled, Snoozed: s.Snoozed, Expired: s.Expired, Paused: slices.Contains(pausedQs, s.Queue)}
		out[i].setFlow(s)
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
		for _, id := range s.OldestReady { // one per level that has ready tasks
			ids = append(ids, id)
			at = append(at, i)
		}
	}
	recs, _, err := in.store.Records(ctx, conn, ids)
	if err != nil {
		errs = append(errs, err)
	}
	now := in.cfg.Advanced.Clock.Now()
	for j, r := range recs {
		if r != nil {
			out[at[j]].Latency = max(out[at[j]].Latency, now.Sub(fromMs(r.Due)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, failed("read queues", err)
	}
	return out, nil
}

// PreviewLen is how many characters of a payload TaskInfo.Preview keeps.
const previewLen = 64

// Preview returns a printable preview of p of at most n characters:
// the text itself if it is UTF-8 (control characters shown as '.'),
// otherwise its bytes in hex; "…" marks a cut.
func previewOf(p []byte, n int) string {
	if n < 1 {
		return ""
	}
	var s string
	if utf8.Valid(p) {
		s = strings.Map(func(r rune) rune {
			if r < ' ' || r == 0x7f {
				return '.'
			}
			return r
		}, string(p))
	} else {
		s = fmt.Sprintf("%x", p[:min(len(p), n)])
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func viewOf(r *buckets.Record, where buckets.Where) *TaskInfo {
	v := infoFromRecord(r, where)
	v.Preview = previewOf(r.Payload, previewLen)
	if r.State == buckets.StateRunning {
		v.Lease = fromMs(r.Deadline)
	}
	return v
}

// Task is Inspector.Task for one lane.
func (in *laneInspector) Task(ctx context.Context, id string) (*TaskInfo, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, where, err := in.store.Lookup(ctx, conn, id)
	if errors.Is(err, buckets.ErrNotFound) {
		return nil, refused(ErrNotFound, err, "task %s not found (never enqueued, or its record expired)", id)
	}
	if err != nil {
		return nil, failed("look up task "+id, err)
	}
	v := viewOf(r, where)
	if v.State == StateDone {
		res, err := in.client().Result(ctx, id)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		v.Result = res
	}
	return v, nil
}

// WorkerInfo is one registered worker process.
type WorkerInfo struct {
	ID string `json:"id"`
	// Alive: its heartbeat key exists. A dead worker stays registered
	// until a reaper has returned its tasks.
	Alive bool   `json:"alive"`
	Host  string `json:"host,omitempty"`
	PID   int    `json:"pid,omitempty"`
	// Started is when the process started, if its heartbeat says.
	Started time.Time `json:"started,omitzero"`
	// LastBeat is when its last heartbeat was sent (the worker's clock),
	// and HeartbeatAge how long ago that is on this process's clock.
	LastBeat     time.Time     `json:"last_beat,omitzero"`
	HeartbeatAge time.Duration `json:"heartbeat_age_ns"`
	// HeartbeatTTL is what is left of its heartbeat key's TTL.
	HeartbeatTTL time.Duration `json:"heartbeat_ttl_ns"`
	Queues       []string      `json:"queues,omitempty"`
	// Types lists the task types it handles, if its heartbeat says.
	Types       []string `json:"types,omitempty"`
	Concurrency int      `json:"concurrency,omitempty"`
	// Running counts the tasks it runs now; Tasks lists the first of
	// them (at most 20), by lease deadline.
	Running int64 `json:"running"`
	// Inflight counts ids it took and has not claimed yet.
	Inflight int64         `json:"inflight"`
	Tasks    []RunningTask `json:"tasks,omitempty"`
}

// RunningTask is one entry of a worker's pending set.
type RunningTask struct {
	ID    string    `json:"id"`
	Lease time.Time `json:"lease"`
}

// WorkerTaskLimit is how many running tasks Workers lists per worker.
const workerTaskLimit = 20

// Workers is Inspector.Workers for one lane.
func (in *laneInspector) Workers(ctx context.Context) ([]WorkerInfo, error) {
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	snap, err := in.store.WorkerSnapshots(ctx, conn, workerTaskLimit)
	if err != nil {
		return nil, failed("list workers", err)
	}
	now := in.cfg.Advanced.Clock.Now()
	out := make([]WorkerInfo, len(snap))
	var errs []error
	for i, s := range snap {
		w := WorkerInfo{ID: s.ID, Alive: s.Info != nil, Running: s.Running, Inflight: s.Inflight}
		if s.TTL > 0 {
			w.HeartbeatTTL = time.Duration(s.TTL) * time.Second
		}
		if s.Info != nil {
			var hb struct {
				Host        string   `json:"host"`
				PID         int      `json:"pid"`
				Queues      []string `json:"queues"`
				Types       []string `json:"types"`
				Concurrency int      `json:"concurrency"`
				At          string   `json:"at"`
				Started     string   `json:"started"`
			}
			if err := json.Unmarshal(s.Info, &hb); err == nil {
				w.Host, w.PID, w.Queues, w.Types, w.Concurrency = hb.Host, hb.PID, hb.Queues, hb.Types, hb.Concurrency
				if t, err := time.Parse(time.RFC3339Nano, hb.At); err == nil {
					w.LastBeat = t
					w.HeartbeatAge = max(0, now.Sub(t))
				}
				if t, err := time.Parse(time.RFC3339Nano, hb.Started); err == nil {
					w.Started = t
				}
			}
		}
		for _, t := range s.Tasks {
			w.Tasks = append(w.Tasks, RunningTask{ID: t.ID, Lease: fromMs(t.Score)})
		}
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
		out[i] = w
	}
	if err := errors.Join(errs...); err != nil {
		return out, failed("list workers", err)
	}
	return out, nil
}
