package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// DeadLetters lists dead tasks, newest first: count of them from offset.
// Each carries the last error, attempts and times.
func (c *Client) DeadLetters(ctx context.Context, offset, count int) ([]*TaskInfo, error) {
	if offset < 0 || count < 1 {
		return nil, fmt.Errorf("engine: DeadLetters(%d, %d): %w", offset, count, ErrInvalidOption)
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ids, err := c.store.DeadIDs(ctx, conn, offset, count)
	if err != nil {
		return nil, failed("list dead letters", err)
	}
	recs, _, err := c.store.Records(ctx, conn, ids)
	if err != nil {
		return nil, failed("list dead letters", err)
	}
	out := make([]*TaskInfo, 0, len(recs))
	for _, r := range recs {
		if r != nil {
			out = append(out, infoFromRecord(r, buckets.InRecord))
		}
	}
	return out, nil
}

// DeadCount is the number of dead letters.
func (c *Client) DeadCount(ctx context.Context) (int, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	n, err := c.store.DeadCount(ctx, conn)
	if err != nil {
		return 0, failed("count dead letters", err)
	}
	return n, nil
}

// RetryDead puts one dead letter back at the front of its queue with its
// attempts reset. It returns ErrNotDead if the task is not a dead letter.
// A task enqueued with a unique key takes it again; if another task holds
// it, nothing is done and the error is a *DuplicateError naming it.
func (c *Client) RetryDead(ctx context.Context, id string) error {
	return c.deadOne(ctx, "retry", id, c.store.Revive)
}

// PurgeDead deletes one dead letter.
func (c *Client) PurgeDead(ctx context.Context, id string) error {
	return c.deadOne(ctx, "purge", id, c.purge)
}

// RetryAllDead puts every dead letter back in its queue and returns how
// many it moved. It takes the dead letters that died before the call (on
// the clocks of the workers that buried them): a revived task that dies
// again meanwhile is not revived twice.
func (c *Client) RetryAllDead(ctx context.Context) (int, error) {
	return c.deadAll(ctx, "retry", c.store.Revive)
}

// PurgeAllDead deletes every dead letter that died before the call and
// returns how many.
func (c *Client) PurgeAllDead(ctx context.Context) (int, error) {
	return c.deadAll(ctx, "purge", c.purge)
}

func (c *Client) deadOne(ctx context.Context, verb, id string, op func(context.Context, redisConn, []string, int64) (int, error)) error {
	if err := checkID(id); err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	n, err := op(ctx, conn, []string{id}, ms(c.cfg.Advanced.Clock.Now()))
	if err != nil {
		return failed(verb+" dead letter "+id, err)
	}
	if n == 0 {
		r, _, err := c.store.Lookup(ctx, conn, id)
		if errors.Is(err, buckets.ErrNotFound) {
			return refused(ErrNotFound, err, "cannot %s dead letter %s: there is no such task", verb, id)
		}
		if err == nil && r.State == buckets.StateDead && r.Unique != "" {
			// Revive skips a task whose unique key another task holds.
			if holder, herr := c.store.UniqueHolder(ctx, conn, r.Unique); herr == nil && holder != "" {
				return &DuplicateError{Key: r.Unique, ID: holder}
			}
		}
		return refused(ErrNotDead, nil, "cannot %s dead letter %s: the task is not dead", verb, id)
	}
	return nil
}

func (c *Client) deadAll(ctx context.Context, verb string, op func(context.Context, redisConn, []string, int64) (int, error)) (int, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// Strictly before the call: a letter it revives that dies again within
	// the same millisecond is not taken a second time.
	cutoff := ms(c.cfg.Advanced.Clock.Now()) - 1
	total := 0
	for {
		ids, err := c.store.DeadBefore(ctx, conn, cutoff, 200)
		if err != nil {
			return total, failed(verb+" dead letters", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		n, err := op(ctx, conn, ids, ms(c.cfg.Advanced.Clock.Now()))
		if err != nil {
			return total, failed(verb+" dead letters", err)
		}
		total += n
		if n == 0 {
			// Every id named was skipped: no longer dead, yet still in the
			// index. Purge would have removed them; stop rather than spin.
			return total, nil
		}
	}
}

// QueueStats is one queue's figures, as Stats reports them.
type QueueStats struct {
	Queue     string
	Ready     int64 // due, waiting for a worker (due retries included)
	Scheduled int64 // waiting for their due time, first attempts
	Running   int64
	Retrying  int64 // failed, waiting in a bucket for their next attempt
	Dead      int64
	Processed int64 // succeeded, ever
	Failed    int64 // handler runs that failed, ever
	Recovered int64 // returned after a worker died or a lease ran out, ever
	Cancelled int64
	// OldestReadyAge is how long the oldest ready task has been due.
	OldestReadyAge time.Duration
	// NextDue is the earliest bucket's time; zero when none is scheduled.
	NextDue time.Time
	// Paused: workers take no task from the queue (PauseQueue).
	Paused bool
}

// Stats reports every queue that was ever enqueued to.
//
// If some of a queue's figures cannot be read (a key of the wrong type in
// Redis, a counter that is not a number), Stats still returns every queue,
// with the figures it could read (the others zero), together with an error
// naming each failed read; a nil error means all figures were read. The
// error wraps nothing a caller can retry away: `engine check` finds the
// damaged key.
func (c *Client) Stats(ctx context.Context) ([]QueueStats, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	raw, serr := c.store.Stats(ctx, conn, 1000)
	if raw == nil && serr != nil {
		return nil, failed("read stats", serr)
	}
	now := c.cfg.Advanced.Clock.Now()
	out := make([]QueueStats, len(raw))
	for i, s := range raw {
		q := QueueStats{Queue: s.Queue, Ready: s.Ready, Scheduled: s.Scheduled, Running: s.Running,
			Retrying: s.Retrying, Dead: s.Dead, Processed: s.Processed, Failed: s.Failed,
			Recovered: s.Recovered, Cancelled: s.Cancelled, NextDue: fromMs(s.NextDue), Paused: s.Paused}
		if s.OldestReady != nil {
			q.OldestReadyAge = max(0, now.Sub(fromMs(s.OldestReady.Due)))
		}
		out[i] = q
	}
	if serr != nil {
		return out, failed("read stats", serr)
	}
	return out, nil
}

type redisConn = redis.Conn

func (c *Client) purge(ctx context.Context, conn redisConn, ids []string, _ int64) (int, error) {
	return c.store.Purge(ctx, conn, ids)
}
