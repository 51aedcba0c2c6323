package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Client enqueues and manages tasks. It is safe for concurrent use. It
// does not own the pool it is given and never closes it.
type laneClient struct {
	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
	group *enqueueGroup // nil: EnqueueGroupMax 1, no group commit
}

// NewClient returns a Client over pool with cfg (zero fields take their
// defaults); it reports a bad cfg.
func newLaneClient(pool *redis.Pool, cfg Config) (*laneClient, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewClient: nil pool: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	c := &laneClient{pool: pool, cfg: cfg, store: st}
	if cfg.Advanced.EnqueueGroupMax > 1 {
		c.group = &enqueueGroup{c: c, max: cfg.Advanced.EnqueueGroupMax, lanes: cfg.Advanced.EnqueueGroupLanes, yields: regroupYields}
	}
	return c, nil
}

func (c *laneClient) conn(ctx context.Context) (redis.Conn, error) {
	conn, err := c.pool.GetContext(ctx)
	if err != nil {
		return nil, failed("get a connection", err)
	}
	return conn, nil
}

// Enqueue adds a task that is due now and returns what was written: its
// id, queue, due time and state (ready or scheduled). The record, its
// place in the ready list and the wake-up of idle workers are written in
// one MULTI/EXEC: once Enqueue returns nil the task is in Redis and will
// run at least once. An invalid type, queue, option or an oversized
// payload is refused before anything is written.
//
// With TaskID, an id that exists is refused (ErrTaskExists) and nothing is
// written. An error matching ErrUncertain means the connection failed
// after the write was sent: retry with the same TaskID to make sure the
// task is written exactly once.
func (c *laneClient) Enqueue(ctx context.Context, typ string, payload []byte, opts ...Option) (*TaskInfo, error) {
	now := c.cfg.Advanced.Clock.Now()
	r, mine, err := c.cfg.record(now, typ, payload, opts)
	if err != nil {
		return nil, err
	}
	var chosen []string
	if mine {
		chosen = []string{r.ID}
	}
	infos, err := c.enqueueRecords(ctx, now, []*buckets.Record{r}, chosen)
	if err != nil {
		return nil, err
	}
	return infos[0], nil
}

// settleEnqueue follows an enqueue whose EXEC reply was lost: if a ready
// list it pushed into is (or was just) of the wrong type, the push may have
// failed while the records were written (2.4 runs the rest of a MULTI), so
// the written records of due tasks are pushed again (see
// buckets.Store.SettleEnqueue). It runs on a fresh connection within the
// caller's own deadline, and only when the reply was lost to a broken
// connection, not to that deadline: an enqueue never takes longer than its
// context allows. The caller still gets ErrUncertain.
func (c *laneClient) settleEnqueue(ctx context.Context, cause error, recs []*buckets.Record, now int64) {
	if ctx.Err() != nil || errors.Is(cause, context.DeadlineExceeded) || errors.Is(cause, context.Canceled) {
		return
	}
	due := map[string][]string{}
	var queues []string
	for _, r := range recs {
		if q := r.Place(); r.Due <= now {
			if len(due[q]) == 0 {
				queues = append(queues, q)
			}
			due[q] = append(due[q], r.ID)
		}
	}
	if len(queues) == 0 {
		return
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, q := range queues {
		if _, err := c.store.SettleEnqueue(ctx, conn, q, due[q]); err != nil {
			c.cfg.Logger.Warn("could not check an enqueue whose reply was lost", keyQueue, q, keyErr, err)
			return
		}
	}
}

// EnqueueBatch adds many tasks in one round trip and one MULTI/EXEC: all
// of them are written, or (with an error) none. Every task is checked
// before anything is sent. It returns what was written, in order, as
// Enqueue does.
//
// The tasks of a batch of several are at most 4 MiB together
// (else ErrTooLarge).
//
// Tasks with a TaskID are checked to be new in the same transaction (one
// more round trip): if any id exists, none of the tasks is written and
// the error is a *ExistsError naming every id that exists. Two tasks
// of one batch may not share an id.
func (c *laneClient) EnqueueBatch(ctx context.Context, tasks []NewTask) ([]*TaskInfo, error) {
	now := c.cfg.Advanced.Clock.Now()
	recs := make([]*buckets.Record, len(tasks))
	var chosen []string
	at := map[string]int{}
	for i, t := range tasks {
		r, mine, err := c.cfg.record(now, t.Type, t.Payload, t.Options)
		if err != nil {
			if len(tasks) > 1 {
				return nil, &engineError{msg: fmt.Sprintf("engine: task %d: %s", i, strings.TrimPrefix(err.Error(), "engine: ")), kind: kindOf(err), cause: err}
			}
			return nil, err
		}
		if mine {
			if j, dup := at[r.ID]; dup {
				return nil, fmt.Errorf("engine: tasks %d and %d both have id %q: %w", j, i, r.ID, ErrInvalid)
			}
			at[r.ID] = i
			chosen = append(chosen, r.ID)
		}
		recs[i] = r
	}
	if len(recs) > 1 {
		if err := checkWriteBytes(ErrTooLarge, fmt.Sprintf("batch of %d tasks", len(recs)), recs); err != nil {
			return nil, err
		}
	}
	return c.enqueueRecords(ctx, now, recs, chosen)
}

// enqueueRecords writes checked records in one transaction, shared with
// other enqueues of this Client when group commit allows (see
// enqueueGroup); chosen lists the caller-chosen ids among them.
func (c *laneClient) enqueueRecords(ctx context.Context, now time.Time, recs []*buckets.Record, chosen []string) ([]*TaskInfo, error) {
	if c.group != nil && groupable(recs, chosen) {
		return c.group.enqueue(ctx, now, recs)
	}
	return c.write(ctx, now, recs, chosen)
}

// write writes checked records in one transaction of their own.
func (c *laneClient) write(ctx context.Context, now time.Time, recs []*buckets.Record, chosen []string) ([]*TaskInfo, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := c.store.Enqueue(ctx, conn, ms(now), recs, chosen...); err != nil {
		var ex *buckets.ExistsError
		var dup *buckets.DuplicateError
		switch {
		case errors.As(err, &ex):
			return nil, &ExistsError{IDs: ex.IDs}
		case errors.As(err, &dup):
			return nil, &ExistsError{Key: dup.Key, IDs: []string{dup.ID}}
		case errors.Is(err, buckets.ErrSetAside):
			// Written all the same; someone put keys of the wrong type in
			// the namespace.
			c.cfg.Logger.Error("keys of the wrong type set aside while enqueueing", keyErr, err)
			c.cfg.observeEnqueued(recs, now)
			return enqueued(recs, now), nil
		case errors.Is(err, buckets.ErrUncertain):
			c.settleEnqueue(ctx, err, recs, ms(now))
			cerr := ctx.Err()
			if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
				// A read deadline set from ctx's fired a moment before
				// ctx's own timer.
				cerr = context.DeadlineExceeded
			}
			if cerr != nil && !errors.Is(err, cerr) {
				// The context ended while the reply was awaited or
				// settled: the error says so too (errors.Is).
				err = fmt.Errorf("%w (%w)", err, cerr)
			}
		}
		return nil, failed("enqueue", err)
	}
	c.cfg.observeEnqueued(recs, now)
	return enqueued(recs, now), nil
}

// enqueued describes records just written by a producer at now.
func enqueued(recs []*buckets.Record, now time.Time) []*TaskInfo {
	out := make([]*TaskInfo, len(recs))
	for i, r := range recs {
		where := buckets.InBucket
		if r.Due <= ms(now) {
			where = buckets.InReady
		}
		out[i] = infoFromRecord(r, where)
	}
	return out
}

// Cancel is Client.Cancel for one lane.
func (c *laneClient) Cancel(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = c.store.Cancel(ctx, conn, id, ms(c.cfg.Advanced.Clock.Now()), c.cfg.doneTTL())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, buckets.ErrNotFound):
		return refused(ErrNotFound, err, "cannot cancel task %s: there is no such task (never enqueued, or its record expired)", id)
	case errors.Is(err, buckets.ErrAlreadyRunning):
		return refused(ErrAlreadyRunning, err, "cannot cancel task %s: it is running already", id)
	case errors.Is(err, buckets.ErrAlreadyDone):
		return refused(ErrAlreadyDone, err, "cannot cancel task %s: it has finished already (succeeded, died or was cancelled)", id)
	}
	return failed("cancel task "+id, err)
}

// Lookup is Client.Lookup for one lane.
func (c *laneClient) Lookup(ctx context.Context, id string) (*TaskInfo, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, where, err := c.store.Lookup(ctx, conn, id)
	if errors.Is(err, buckets.ErrNotFound) {
		return nil, refused(ErrNotFound, err, "task %s not found (never enqueued, or its record expired)", id)
	}
	if err != nil {
		return nil, failed("look up task "+id, err)
	}
	return infoFromRecord(r, where), nil
}

// checkID refuses an id no task can have, before any round trip: the
// error matches ErrInvalid and ErrNotFound.
func checkID(id string) error {
	if err := validateID(id); err != nil {
		return &engineError{msg: err.Error(), kind: ErrNotFound, cause: err}
	}
	return nil
}
