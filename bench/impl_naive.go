package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// naive is the per-task design of the classic "delayed queue in Redis"
// articles, written with redigo and kept deliberately plain:
//
//   - Schedule: ZADD <ns>:naive:delayed <due> <id|payload>, the score being
//     the due time in microseconds (rounded up, so a task is never due early);
//   - a poller loops ZRANGEBYSCORE delayed -inf <now> LIMIT 0 1, then ZREM to
//     claim that one member (only the poller whose ZREM returns 1 owns it),
//     then RPUSH <ns>:naive:ready; when nothing is due it sleeps (10ms by
//     default, Env.Poll when set);
//   - Enqueue (due now) RPUSHes straight to the ready list;
//   - workers BLPOP the ready list (1s timeout, so they notice stop) and run
//     the handler. There is no acknowledgement: a task popped by a worker that
//     dies is lost, as in the articles.
//
// Every command exists in Redis 2.4 (variadic ZADD/RPUSH included).
type naive struct {
	pool    *redis.Pool
	ns      string
	delayed string
	ready   string
	seed    string
	poll    time.Duration
	logf    func(string, ...any)
}

func init() { register("naive", func() Impl { return &naive{} }) }

// naiveDefaultPoll is the poller's sleep when nothing is due.
const naiveDefaultPoll = 10 * time.Millisecond

// Name implements Impl.
func (n *naive) Name() string { return "naive" }

// Open implements Impl.
func (n *naive) Open(ctx context.Context, env Env) error {
	n.ns = env.Namespace + ":naive:"
	n.delayed = n.ns + "delayed"
	n.ready = n.ns + "ready"
	n.seed = n.ns + "seed"
	n.poll = env.Poll
	if n.poll <= 0 {
		n.poll = naiveDefaultPoll
	}
	n.logf = env.Logf
	addr := env.Addr
	n.pool = &redis.Pool{
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", addr, redis.DialConnectTimeout(5*time.Second))
		},
		MaxIdle:     256,
		IdleTimeout: time.Minute,
	}
	c := n.pool.Get()
	defer c.Close()
	_, err := c.Do("PING")
	return err
}

// Close implements Impl.
func (n *naive) Close() error {
	if n.pool == nil {
		return nil
	}
	return n.pool.Close()
}

// KeyPatterns implements Impl.
func (n *naive) KeyPatterns() []string { return []string{n.ns + "*"} }

// score is the ZSET score of a due time: microseconds since the epoch,
// rounded up.
func naiveScore(due time.Time) int64 {
	if due.IsZero() {
		due = time.Now()
	}
	ns := due.UnixNano()
	us := ns / 1000
	if ns%1000 > 0 {
		us++
	}
	return us
}

// Enqueue implements Impl: RPUSH straight to the ready list.
func (n *naive) Enqueue(ctx context.Context, t Task) error {
	c := n.pool.Get()
	defer c.Close()
	_, err := c.Do("RPUSH", n.ready, encodeTask(t))
	return err
}

// EnqueueBatch implements Batcher: one variadic RPUSH.
func (n *naive) EnqueueBatch(ctx context.Context, ts []Task) error {
	if len(ts) == 0 {
		return nil
	}
	args := make([]any, 0, 1+len(ts))
	args = append(args, n.ready)
	for _, t := range ts {
		args = append(args, encodeTask(t))
	}
	c := n.pool.Get()
	defer c.Close()
	_, err := c.Do("RPUSH", args...)
	return err
}

// Schedule implements Scheduler: one ZADD.
func (n *naive) Schedule(ctx context.Context, t Task) error {
	c := n.pool.Get()
	defer c.Close()
	_, err := c.Do("ZADD", n.delayed, naiveScore(t.Due), encodeTask(t))
	return err
}

// ScheduleBatch implements BatchScheduler: one variadic ZADD.
func (n *naive) ScheduleBatch(ctx context.Context, ts []Task) error {
	c := n.pool.Get()
	defer c.Close()
	return n.zaddAll(c, n.delayed, ts)
}

// zaddAll adds ts to key with variadic ZADDs of at most 1000 members, pipelined.
func (n *naive) zaddAll(c redis.Conn, key string, ts []Task) error {
	const chunk = 1000
	sent := 0
	for i := 0; i < len(ts); i += chunk {
		j := min(i+chunk, len(ts))
		args := make([]any, 0, 1+2*(j-i))
		args = append(args, key)
		for _, t := range ts[i:j] {
			args = append(args, naiveScore(t.Due), encodeTask(t))
		}
		if err := c.Send("ZADD", args...); err != nil {
			return err
		}
		sent++
	}
	if err := c.Flush(); err != nil {
		return err
	}
	for ; sent > 0; sent-- {
		if _, err := c.Receive(); err != nil {
			return err
		}
	}
	return nil
}

// moveOne is one step of the poller: find the earliest due task, claim it
// with ZREM, push it to the ready list. It reports whether a due task was
// found (even if another poller won the claim).
func (n *naive) moveOne(c redis.Conn, nowMicros int64) (bool, error) {
	ms, err := redis.ByteSlices(c.Do("ZRANGEBYSCORE", n.delayed, "-inf", nowMicros, "LIMIT", 0, 1))
	if err != nil || len(ms) == 0 {
		return false, err
	}
	won, err := redis.Int(c.Do("ZREM", n.delayed, ms[0]))
	if err != nil {
		return true, err
	}
	if won == 1 {
		if _, err := c.Do("RPUSH", n.ready, ms[0]); err != nil {
			return true, err
		}
	}
	return true, nil
}

// poller moves due tasks until ctx is done.
func (n *naive) poller(ctx context.Context) error {
	c := n.pool.Get()
	defer c.Close()
	for ctx.Err() == nil {
		found, err := n.moveOne(c, naiveScore(time.Now()))
		if err != nil {
			return fmt.Errorf("naive poller: %w", err)
		}
		if !found && !sleepCtx(ctx, n.poll) {
			return nil
		}
	}
	return nil
}

// worker pops ready tasks and runs h until ctx is done.
func (n *naive) worker(ctx context.Context, h Handler) error {
	c := n.pool.Get()
	defer c.Close()
	for ctx.Err() == nil {
		r, err := redis.ByteSlices(c.Do("BLPOP", n.ready, 1))
		if errors.Is(err, redis.ErrNil) {
			continue
		}
		if err != nil {
			return fmt.Errorf("naive worker: %w", err)
		}
		d, err := decodeTask(r[1])
		if err != nil {
			return err
		}
		if err := h(ctx, d); err != nil {
			n.logf("naive: handler error (task dropped, no retry in this design): %v", err)
		}
	}
	return nil
}

// Consume implements Impl.
func (n *naive) Consume(ctx context.Context, cfg ConsumeConfig, h Handler) (func() error, error) {
	g := newGroup()
	for range cfg.Dispatchers {
		g.Go(n.poller)
	}
	for range cfg.Workers {
		g.Go(func(ctx context.Context) error { return n.worker(ctx, h) })
	}
	return g.Stop, nil
}

// SeedDue implements Dispatcher: the backlog is built under a temporary key.
func (n *naive) SeedDue(ctx context.Context, ts []Task) error {
	c := n.pool.Get()
	defer c.Close()
	if _, err := c.Do("DEL", n.seed); err != nil {
		return err
	}
	return n.zaddAll(c, n.seed, ts)
}

// StartDispatchers implements Dispatcher: n pollers, no workers.
func (n *naive) StartDispatchers(ctx context.Context, k int) (func() error, error) {
	g := newGroup()
	for range k {
		g.Go(n.poller)
	}
	return g.Stop, nil
}

// Release implements Dispatcher: RENAME the seeded backlog into place.
func (n *naive) Release(ctx context.Context) error {
	c := n.pool.Get()
	defer c.Close()
	_, err := c.Do("RENAME", n.seed, n.delayed)
	return err
}

// ReadyCount implements Dispatcher.
func (n *naive) ReadyCount(ctx context.Context) (int64, error) {
	c := n.pool.Get()
	defer c.Close()
	return redis.Int64(c.Do("LLEN", n.ready))
}
