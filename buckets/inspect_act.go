package buckets

import (
	"context"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Action is what Act does to each task it is given.
type Action int

// Actions of Act.
const (
	// ActRun makes a scheduled or retrying task (in its bucket) ready now,
	// at the pop end of its ready list.
	ActRun Action = iota + 1
	// ActRetry puts a dead letter back at the pop end of its ready list
	// with its attempts reset, and makes a retrying task ready now.
	ActRetry
	// ActCancel cancels a task that has not started (scheduled, ready,
	// retrying), as Cancel does.
	ActCancel
	// ActDelete deletes a task in any state.
	ActDelete
)

func (a Action) String() string {
	switch a {
	case ActRun:
		return "run"
	case ActRetry:
		return "retry"
	case ActCancel:
		return "cancel"
	case ActDelete:
		return "delete"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ActResult counts what Act did.
type ActResult struct {
	Done    int // tasks the action applied to
	Skipped int // tasks in a state the action does not apply to
	Missing int // ids without a record
}

// MaxActBatch is the most ids Act takes in one call (one transaction).
const MaxActBatch = 100

// Act applies action a to the tasks ids (at most MaxActBatch) in one
// optimistic transaction; tasks in a state the action does not apply to
// are skipped and counted. now is the caller's clock (Unix ms); ttl is how
// long a cancelled record is kept (seconds, at least one hour).
//
// WATCH   t:<id> of every id, then b:<q>:<ts> of every waiting/retrying
//
//	task's bucket and g:<k> of every waiting task's inline entry (an
//	Inlineable id)
//
// read    GET t:<id> (pipelined); ZSCORE sched member + LRANGE bucket per
//
//	bucket, ZSCORE sched entry per inline entry (pipelined)
//
// queue   per task, by action and where it is:
//
//	run/retry, in its bucket: LREM b 1 id (+ ZREM sched member when the
//	  bucket empties), or ZREM sched entry + INCR g:<k> (inline),
//	  scheduled -1, SET t:<id> due now, RPUSH q (front) + tokens
//	retry, dead: ZREM dead, dead -1, SET t:<id> waiting with attempts
//	  reset, RPUSH q (front) + tokens
//	cancel, waiting/retrying: as Cancel (bucket or LREM q), SETEX t:<id>
//	  cancelled, cancelled +1 (retrying -1)
//	delete, in its bucket: LREM b (+ ZREM member), or ZREM entry + INCR
//	  g:<k>, scheduled -1 (retrying -1), DEL t:<id>
//	delete, ready (or popped, not claimed): LREM q 1 id (retrying -1),
//	  SETEX t:<id> a cancelled tombstone saying "deleted" for ttl, so a
//	  worker that popped it drops it at its claim instead of burying it
//	delete, running: ZREM p:<w> id, running -1, DEL t:<id> (the worker's
//	  finish then finds no record and drops its result)
//	delete, dead: ZREM dead id, dead -1, DEL t:<id>
//	delete, done/cancelled: DEL t:<id>
//
// A crash before EXEC writes nothing (the server drops the WATCH with the
// connection); EXEC writes the whole batch. Any change to a watched key
// meanwhile makes EXEC answer nil and the batch is read again.
//
// guard, when not nil, is asked first for each task, with the record and
// whether it is in its bucket: a task it refuses is skipped, so a bulk
// action over a listing applies only to the tasks still in the listed
// state when the batch commits.
func (s *Store) Act(ctx context.Context, conn redis.Conn, a Action, ids []string, now, ttl int64, guard func(r *Record, inBucket bool) bool) (ActResult, error) {
	if len(ids) == 0 {
		return ActResult{}, nil
	}
	if len(ids) > MaxActBatch {
		return ActResult{}, fmt.Errorf("buckets: %s: %d ids in one batch, want at most %d", a, len(ids), MaxActBatch)
	}
	ttl = max(ttl, 3600)
	// An id named twice is acted on once: its writes queued twice would
	// move the gauges twice.
	uniq := make([]string, 0, len(ids))
	dup := map[string]bool{}
	for _, id := range ids {
		if !dup[id] {
			dup[id] = true
			uniq = append(uniq, id)
		}
	}
	ids = uniq
	watch := s.Keys.Tasks(ids)
	var res ActResult
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		res = ActResult{}
		views := FlowViews{}
		reps, err := getAll(tx, watch)
		if err != nil {
			return err
		}
		recs := make([]*Record, len(ids))
		type bkey struct {
			q  string
			ts int64
		}
		var bks []bkey
		seen := map[bkey]bool{}
		// Waiting tasks that may have an inline entry, and the guards
		// of those entries (bit g: Guard(g) is in guardKeys).
		var inl []*Record
		var guards uint32
		var guardKeys []string
		for i, id := range ids {
			if e, ok := reps[i].(redis.Error); ok {
				return fmt.Errorf("read %s: %w", id, e)
			}
			raw, _ := reps[i].([]byte)
			if raw == nil {
				continue
			}
			r, derr := DecodeRecord(id, raw)
			if derr != nil {
				continue // the claim or the checker deals with it
			}
			recs[i] = r
			if mayBeInline(r) {
				inl = append(inl, r)
				if g := GuardOf(id); guards&(1<<g) == 0 {
					guards |= 1 << g
					guardKeys = append(guardKeys, s.Keys.Guard(g))
				}
			}
			if r.State == StateWaiting || r.State == StateRetry {
				k := bkey{r.Place(), BucketTime(r.Due, s.Resolution)}
				if !seen[k] {
					seen[k] = true
					bks = append(bks, k)
				}
			}
		}
		// Where each waiting task is: in its bucket or not.
		indexed := map[bkey]bool{}
		content := map[bkey]map[string]bool{}
		size := map[bkey]int{}
		inline := map[string]bool{} // ids found in their inline entries
		if len(bks) > 0 {
			keys := make([]string, len(bks), len(bks)+len(guardKeys))
			for i, k := range bks {
				keys[i] = s.Keys.Bucket(k.q, k.ts)
			}
			if err := tx.Watch(append(keys, guardKeys...)...); err != nil {
				return err
			}
			for _, k := range bks {
				if err := tx.Send("ZSCORE", s.Keys.Schedule(), Member(k.q, k.ts)); err != nil {
					return err
				}
				if err := tx.Send("LRANGE", s.Keys.Bucket(k.q, k.ts), 0, -1); err != nil {
					return err
				}
			}
			for _, r := range inl {
				if err := tx.Send("ZSCORE", s.Keys.Schedule(), InlineMember(r.Place(), r.ID)); err != nil {
					return err
				}
			}
			reps, err := tx.Flush()
			if err != nil {
				return err
			}
			for j, r := range inl {
				rep := reps[2*len(bks)+j]
				if e, ok := rep.(redis.Error); ok {
					return fmt.Errorf("bucket index: %w", e)
				}
				inline[r.ID] = rep != nil
			}
			for i, k := range bks {
				if e, ok := reps[2*i].(redis.Error); ok {
					return fmt.Errorf("bucket index: %w", e)
				}
				indexed[k] = reps[2*i] != nil
				l, err := redis.Strings(reps[2*i+1], nil)
				if err != nil {
					return fmt.Errorf("bucket %s: %w", Member(k.q, k.ts), err)
				}
				size[k] = len(l)
				content[k] = map[string]bool{}
				for _, id := range l {
					content[k][id] = true
				}
			}
		}
		removed := map[bkey]int{}
		var touched uint32 // bit g: an inline entry of guard g is removed
		fromBucket := func(r *Record) {
			if inline[r.ID] {
				tx.Queue("ZREM", s.Keys.Schedule(), InlineMember(r.Place(), r.ID))
				touched |= 1 << GuardOf(r.ID)
				s.unbucketed(tx, r)
				return
			}
			k := bkey{r.Place(), BucketTime(r.Due, s.Resolution)}
			tx.Queue("LREM", s.Keys.Bucket(k.q, k.ts), 1, r.ID)
			s.unbucketed(tx, r)
			removed[k]++
		}
		for i, r := range recs {
			if r == nil {
				res.Missing++
				if a == ActDelete {
					// A dead-letter entry may outlive its record.
					tx.Queue("ZREM", s.Keys.Dead(), ids[i])
				}
				continue
			}
			st := s.Keys.Stats(r.Queue)
			inBucket := false
			if r.State == StateWaiting || r.State == StateRetry {
				k := bkey{r.Place(), BucketTime(r.Due, s.Resolution)}
				inBucket = inline[r.ID] || indexed[k] && content[k][r.ID]
			}
			ok := true
			switch {
			case guard != nil && !guard(r, inBucket):
				ok = false
			case (a == ActRun || a == ActRetry) && inBucket:
				fromBucket(r)
				r.Due = now
				tx.Queue("SET", s.Keys.Task(r.ID), r.Encode())
				s.pushReady(tx, r.Place(), []string{r.ID}, true)
			case a == ActRetry && r.State == StateDead:
				// As a revival: it takes its unique key back (skipped
				// while another task holds it), and its completion list
				// from the death goes, so that a Wait sees the new run.
				if r.Unique != "" {
					free, err := s.uniqueFree(tx, r)
					if err != nil {
						return err
					}
					if !free {
						ok = false
						break
					}
					s.takeUnique(tx, []string{s.Keys.Unique(r.Unique)}, []*Record{r})
				}
				tx.Queue("DEL", s.Keys.Completion(r.ID))
				tx.Queue("ZREM", s.Keys.Dead(), r.ID)
				tx.Queue("HINCRBY", st, StatDead, -1)
				r.State = StateWaiting
				r.Attempts, r.Recoveries = 0, 0
				r.Due, r.Finished = now, 0
				tx.Queue("SET", s.Keys.Task(r.ID), r.Encode())
				s.pushReady(tx, r.Place(), []string{r.ID}, true)
			case a == ActCancel && (r.State == StateWaiting || r.State == StateRetry):
				if inBucket {
					fromBucket(r)
				} else {
					tx.Queue("LREM", s.Keys.Ready(r.Place()), 1, r.ID)
				}
				if err := s.flowRead(tx, r, views); err != nil {
					return err
				}
				r.State, r.Finished = StateCancelled, now
				tx.Queue("SETEX", s.Keys.Task(r.ID), ttl, r.Encode())
				tx.Queue("HINCRBY", st, StatCancelled, 1)
				s.flowWrites(tx, r) // a workflow's task: its group or chain learns of it
			case a == ActDelete:
				// A workflow's step or member that is deleted before it
				// ended counts as cancelled ("deleted") for its chain or
				// group, which would otherwise wait for it for ever.
				var ended *Record
				if r.Flow != nil && (r.State == StateWaiting || r.State == StateRetry || r.State == StateRunning) {
					if err := s.flowRead(tx, r, views); err != nil {
						return err
					}
					ended = r.clone()
					ended.State, ended.Finished, ended.LastError = StateCancelled, now, "deleted"
				}
				switch r.State {
				case StateWaiting, StateRetry:
					if inBucket {
						fromBucket(r)
						tx.Queue("DEL", s.Keys.Task(r.ID))
					} else {
						tx.Queue("LREM", s.Keys.Ready(r.Place()), 1, r.ID)
						r.State, r.Finished, r.LastError = StateCancelled, now, "deleted"
						tx.Queue("SETEX", s.Keys.Task(r.ID), ttl, r.Encode())
					}
				case StateRunning:
					tx.Queue("ZREM", s.Keys.Pending(r.Worker), r.ID)
					tx.Queue("HINCRBY", st, StatRunning, -1)
					s.releaseSlot(tx, r, now)
					tx.Queue("DEL", s.Keys.Task(r.ID))
				case StateDead:
					tx.Queue("ZREM", s.Keys.Dead(), r.ID)
					tx.Queue("HINCRBY", st, StatDead, -1)
					tx.Queue("DEL", s.Keys.Task(r.ID))
				default:
					tx.Queue("DEL", s.Keys.Task(r.ID))
				}
				if ended != nil {
					s.flowWrites(tx, ended)
				}
			default:
				ok = false
			}
			if ok {
				res.Done++
			} else {
				res.Skipped++
			}
		}
		// A bucket emptied by this batch is gone: its index member goes
		// with it, so the index names no empty bucket.
		for k, n := range removed {
			if n >= size[k] && indexed[k] {
				s.dropMember(tx, Member(k.q, k.ts))
			}
		}
		for g := range Guards {
			if touched&(1<<g) != 0 {
				tx.Queue("INCR", s.Keys.Guard(g))
			}
		}
		return nil
	})
	if err != nil {
		return ActResult{}, fmt.Errorf("buckets: %s: %w", a, err)
	}
	return res, nil
}
