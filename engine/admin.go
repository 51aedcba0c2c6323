package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Stats is Inspector.Queues for one lane: every queue that was ever
// enqueued to.
//
// If some of a queue's figures cannot be read (a key of the wrong type in
// Redis, a counter that is not a number), Stats still returns every queue,
// with the figures it could read (the others zero), together with an error
// naming each failed read; a nil error means all figures were read. The
// error wraps nothing a caller can retry away: `engine check` finds the
// damaged key.
func (c *laneClient) Stats(ctx context.Context) ([]QueueInfo, error) {
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
	out := make([]QueueInfo, len(raw))
	for i, s := range raw {
		q := QueueInfo{Queue: s.Queue, Ready: s.Ready, Scheduled: s.Scheduled, Running: s.Running,
			Retrying: s.Retrying, Dead: s.Dead, Processed: s.Processed, Failed: s.Failed,
			Recovered: s.Recovered, Cancelled: s.Cancelled, Snoozed: s.Snoozed, Expired: s.Expired, NextDue: fromMs(s.NextDue), Paused: s.Paused}
		q.setFlow(s.QueueSnapshot)
		if s.Oldest != nil {
			q.Latency = max(0, now.Sub(fromMs(s.Oldest.Due)))
		}
		out[i] = q
	}
	if serr != nil {
		return out, failed("read stats", serr)
	}
	return out, nil
}

type redisConn = redis.Conn

// KeyInfo is one key of a queue with tasks waiting (the Key option).
type KeyInfo struct {
	Key     string    `json:"key"`
	Waiting int64     `json:"waiting"`   // its tasks waiting in their key's lists
	Running int64     `json:"running"`   // its slots in use (QueueConfig.KeyMaxRunning)
	Next    time.Time `json:"next_turn"` // when it next comes in turn: when last served, or when its rate window opens
}

// Keys is Inspector.Keys for one lane.
func (c *laneClient) Keys(ctx context.Context, q string, n int) ([]KeyInfo, error) {
	if err := validateQueue(q); err != nil {
		return nil, err
	}
	if n < 1 || n > maxListLimit {
		return nil, fmt.Errorf("engine: keys limit %d: want 1 to %d: %w", n, maxListLimit, ErrInvalid)
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	raw, err := c.store.KeysWaiting(ctx, conn, q, n)
	if err != nil {
		return nil, failed("read the keys of queue "+q, err)
	}
	out := make([]KeyInfo, len(raw))
	for i, k := range raw {
		out[i] = KeyInfo{Key: k.Key, Waiting: k.Waiting, Running: k.Running, Next: fromMs(k.Next)}
	}
	return out, nil
}
