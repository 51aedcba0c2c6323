package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// Client enqueues and manages tasks. It is safe for concurrent use. It
// does not own the pool it is given and never closes it.
type Client struct {
	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
}

// NewClient returns a Client over pool with cfg (zero fields take their
// defaults); it reports a bad cfg.
func NewClient(pool *redis.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewClient: nil pool: %w", ErrInvalidOption)
	}
	cfg, st, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	return &Client{pool: pool, cfg: cfg, store: st}, nil
}

func (c *Client) conn(ctx context.Context) (redis.Conn, error) {
	conn, err := c.pool.GetContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("engine: get connection: %w", err)
	}
	return conn, nil
}

// Enqueue adds a task that is due now and returns its id. The record, its
// place in the ready list and the wake-up of idle workers are written in
// one MULTI/EXEC: once Enqueue returns nil the task is in Redis and will
// run at least once. An invalid type, queue, option or an oversized
// payload is refused before anything is written.
func (c *Client) Enqueue(ctx context.Context, typ string, payload []byte, opts ...Option) (string, error) {
	ids, err := c.EnqueueBatch(ctx, []NewTask{{Type: typ, Payload: payload, Options: opts}})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// EnqueueAt adds a task due at t (now, if t has passed) and returns its id.
func (c *Client) EnqueueAt(ctx context.Context, t time.Time, typ string, payload []byte, opts ...Option) (string, error) {
	return c.Enqueue(ctx, typ, payload, append(opts, At(t))...)
}

// EnqueueIn adds a task due d from now and returns its id.
func (c *Client) EnqueueIn(ctx context.Context, d time.Duration, typ string, payload []byte, opts ...Option) (string, error) {
	return c.Enqueue(ctx, typ, payload, append(opts, In(d))...)
}

// EnqueueBatch adds many tasks in one round trip and one MULTI/EXEC: all
// of them are written, or (with an error) none. Every task is checked
// before anything is sent. It returns the ids in order.
func (c *Client) EnqueueBatch(ctx context.Context, tasks []NewTask) ([]string, error) {
	now := c.cfg.Clock.Now()
	recs := make([]*buckets.Record, len(tasks))
	ids := make([]string, len(tasks))
	for i, t := range tasks {
		r, err := c.cfg.record(now, t.Type, t.Payload, t.Options)
		if err != nil {
			if len(tasks) > 1 {
				return nil, fmt.Errorf("engine: task %d: %w", i, err)
			}
			return nil, err
		}
		recs[i], ids[i] = r, r.ID
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := c.store.Enqueue(ctx, conn, ms(now), recs); err != nil {
		if errors.Is(err, buckets.ErrSetAside) {
			// Written all the same; someone put keys of the wrong type in
			// the namespace.
			c.cfg.Logger.Error("keys of the wrong type set aside while enqueueing", keyErr, err)
			return ids, nil
		}
		return nil, fmt.Errorf("engine: enqueue: %w", err)
	}
	return ids, nil
}

// Cancel removes a task that has not started, atomically: it will not
// run. It returns ErrNotFound, ErrAlreadyRunning or ErrAlreadyDone when
// it cannot.
func (c *Client) Cancel(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.store.Cancel(ctx, conn, id, ms(c.cfg.Clock.Now()), c.cfg.doneTTL()); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// Lookup reports a task's state and times. Done and cancelled tasks are
// found for Config.DoneRetention, dead ones for Config.DeadRetention.
func (c *Client) Lookup(ctx context.Context, id string) (*TaskInfo, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, where, err := c.store.Lookup(ctx, conn, id)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return infoFromRecord(r, where), nil
}

func checkID(id string) error {
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return fmt.Errorf("engine: task id %q: %w", id, ErrNotFound)
	}
	return nil
}
