package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// LimitMaxRunning is the field of Keys.Limit that holds a queue's
// concurrency limit.
const LimitMaxRunning = "max_running"

// slotWakeTokens bounds a queue's slot wake-up list (Keys.SlotWake).
const slotWakeTokens = 64

// slotBudget is what a claim read of a limited queue's slots: how many
// are free now (limit minus those in use, as read under WATCH sl:<q>).
// A nil *slotBudget is a queue without a limit: the claim takes no slot.
type slotBudget struct{ free int64 }

// sendSlotReads sends, inside a claim's transaction, the reads of queue
// q's slots in use and limit: GET sl:<q>, HGET lim:<q> max_running.
func (s *Store) sendSlotReads(tx *txn.Tx, q string) error {
	if err := tx.Send("GET", s.Keys.Slots(q)); err != nil {
		return err
	}
	return tx.Send("HGET", s.Keys.Limit(q), LimitMaxRunning)
}

// slotBudgetOf reads the replies of sendSlotReads: nil when the queue has
// no limit (absent or 0). A value that is not a number is an error (the
// checker reports, and repairs, a wrong count).
func slotBudgetOf(used, limit interface{}) (*slotBudget, error) {
	n, err := redis.Int64(limit, asError(limit))
	if errors.Is(err, redis.ErrNil) || err == nil && n <= 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("queue limit: %w", err)
	}
	u, err := redis.Int64(used, asError(used))
	if errors.Is(err, redis.ErrNil) {
		u, err = 0, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slots in use: %w", err)
	}
	return &slotBudget{free: n - u}, nil
}

// releaseSlot queues, for a record leaving the running state, the return
// of the slot it holds, if any, and clears its flag (before the caller
// encodes it): DECR sl:<q>; LPUSH sw:<q> 1; LTRIM sw:<q> 0 63.
func (s *Store) releaseSlot(tx queuer, r *Record) {
	if !r.HoldsSlot {
		return
	}
	r.HoldsSlot = false
	tx.Queue("DECR", s.Keys.Slots(r.Queue))
	tx.Queue("LPUSH", s.Keys.SlotWake(r.Queue), "1")
	tx.Queue("LTRIM", s.Keys.SlotWake(r.Queue), 0, slotWakeTokens-1)
}

// SetQueueLimit sets queue q's concurrency limit to n tasks running at
// once (HSET lim:<q> max_running n; SADD queues q), or removes it when n
// is 0 (HDEL). One MULTI without a WATCH; the slots in use are left as
// they are: runs that hold one give it back when they end, and workers
// learn of the change within a second.
func (s *Store) SetQueueLimit(ctx context.Context, conn redis.Conn, q string, n int64) error {
	if n < 0 {
		return fmt.Errorf("buckets: queue limit %d: %w", n, ErrInvalidLimit)
	}
	var cmds cmdList
	if n == 0 {
		cmds.Queue("HDEL", s.Keys.Limit(q), LimitMaxRunning)
	} else {
		cmds.Queue("HSET", s.Keys.Limit(q), LimitMaxRunning, n)
		cmds.Queue("SADD", s.Keys.Queues(), q)
	}
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: set limit of %s: %w", q, err)
	}
	return nil
}

// ErrInvalidLimit: a negative concurrency limit.
var ErrInvalidLimit = errors.New("a queue's concurrency limit must be 0 (none) or more")

// QueueLimits reads the concurrency limits of queues qs in one round trip
// (HGET lim:<q> max_running each, pipelined): 0 for a queue without one,
// or whose limit is not a number.
func (s *Store) QueueLimits(ctx context.Context, conn redis.Conn, qs []string) ([]int64, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	cmds := make([]txn.Cmd, len(qs))
	for i, q := range qs {
		cmds[i] = txn.Cmd{Name: "HGET", Args: []interface{}{s.Keys.Limit(q), LimitMaxRunning}}
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: queue limits: %w", err)
	}
	out := make([]int64, len(qs))
	for i, rep := range reps {
		n, err := redis.Int64(rep, asError(rep))
		if err == nil && n > 0 {
			out[i] = n
		}
	}
	return out, nil
}

// limitFigures reads the replies of GET sl:<q> and HGET lim:<q>
// max_running as figures: the limit (0: none) and the slots in use. What
// is not a number reads as 0 (the checker reports a wrong count).
func limitFigures(used, limit interface{}) (maxRunning, inUse int64) {
	maxRunning, _ = redis.Int64(limit, asError(limit))
	inUse, _ = redis.Int64(used, asError(used))
	return max(maxRunning, 0), inUse
}
