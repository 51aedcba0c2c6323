package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Cancel removes a task that has not started: from its bucket or its ready
// list, leaving a cancelled record for ttl seconds (at least one hour, so
// that a worker that popped the id a moment before finds the tombstone).
//
//	WATCH   t:<id>, then (findSpot) g:<k> of its inline entry when it is a
//	        first attempt with an Inlineable id, then b:<q>:<ts> of its
//	        due time unless the entry was found
//	read    GET t:<id>; ZSCORE sched entry; ZSCORE sched member; LRANGE
//	        bucket (when indexed)
//	queue   ZREM sched entry + INCR g:<k> + HINCRBY scheduled -1 (inline)
//	        or LREM bucket 1 id + HINCRBY scheduled -1   (found in the
//	        bucket; ZREM sched member too when it was the bucket's only id)
//	        or LREM q:<q> 1 id                 (otherwise: ready or taken)
//	        SETEX t:<id> ttl cancelled record; HINCRBY cancelled +1 (retrying -1)
//	        the final writes (unique key, completion, reply: see finalWrites)
//
// If a worker popped the id but has not claimed it, the LREM finds
// nothing, the record becomes a tombstone, and the worker's claim drops
// it. If the claim came first, t:<id> changed and this reads "running".
func (s *Store) Cancel(ctx context.Context, conn redis.Conn, id string, now, ttl int64) error {
	key := s.Keys.Task(id)
	ttl = max(ttl, 3600)
	_, err := s.runner.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
		r, err := s.getRecord(tx, id)
		if err != nil {
			return err
		}
		switch r.State {
		case StateRunning:
			return ErrAlreadyRunning
		case StateDone, StateDead, StateCancelled:
			return fmt.Errorf("task %s is %s: %w", id, r.State, ErrAlreadyDone)
		}
		sp, err := s.findSpot(tx, r)
		if err != nil {
			return err
		}
		st := s.Keys.Stats(r.Queue)
		if sp.scheduled() {
			s.unschedule(tx, r, sp)
		} else {
			tx.Queue("LREM", s.Keys.Ready(r.Place()), 1, id)
		}
		if err := s.flowRead(tx, r, FlowViews{}); err != nil {
			return err
		}
		r.State = StateCancelled
		r.Finished = now
		tx.Queue("SETEX", key, ttl, r.Encode())
		tx.Queue("HINCRBY", st, StatCancelled, 1)
		s.finalWrites(tx, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("buckets: cancel %s: %w", id, err)
	}
	return nil
}

// spot is where a waiting task is scheduled (findSpot): its inline entry,
// its bucket (only: as the bucket's one entry), or neither (its ready
// list, or taken by a worker that has not claimed it yet).
type spot struct {
	inline, bucket, only bool
}

func (sp spot) scheduled() bool { return sp.inline || sp.bucket }

// findSpot watches and reads where waiting or retrying task r is
// scheduled: its inline entry (only a first attempt with an Inlineable id
// can have one) under the watch of its guard, else its bucket under the
// bucket's watch. The caller watches r's record.
func (s *Store) findSpot(tx *txn.Tx, r *Record) (spot, error) {
	if in, err := s.inInlineEntry(tx, r); err != nil || in {
		return spot{inline: in}, err
	}
	ts := BucketTime(r.Due, s.Resolution)
	if err := tx.Watch(s.Keys.Bucket(r.Place(), ts)); err != nil {
		return spot{}, err
	}
	found, only, err := s.inBucket(tx, r.Place(), ts, r.ID)
	return spot{bucket: found, only: only}, err
}

// inInlineEntry reports whether waiting task r is in its inline entry,
// read under the watch of the entry's guard: only a first attempt with an
// Inlineable id can have one (for any other, it watches and reads
// nothing).
func (s *Store) inInlineEntry(tx *txn.Tx, r *Record) (bool, error) {
	if !mayBeInline(r) {
		return false, nil
	}
	if err := tx.Watch(s.Keys.Guard(GuardOf(r.ID))); err != nil {
		return false, err
	}
	score, err := tx.Do("ZSCORE", s.Keys.Schedule(), InlineMember(r.Place(), r.ID))
	return score != nil, err
}

// mayBeInline reports whether task r may be scheduled by an inline entry:
// only a first attempt (waiting) with an Inlineable id can be; retries and
// tasks placed again go to bucket lists.
func mayBeInline(r *Record) bool { return r.State == StateWaiting && Inlineable(r.ID) }

// unschedule queues the removal of r from where findSpot found it: ZREM
// of its inline entry and INCR of the entry's guard, or LREM from its
// bucket (and the bucket's index member, when it was the bucket's only
// entry: the list empties and Redis deletes it, so the index names no
// empty bucket); and the gauge it leaves (unbucketed).
func (s *Store) unschedule(tx queuer, r *Record, sp spot) {
	if sp.inline {
		tx.Queue("ZREM", s.Keys.Schedule(), InlineMember(r.Place(), r.ID))
		tx.Queue("INCR", s.Keys.Guard(GuardOf(r.ID)))
		s.unbucketed(tx, r)
		return
	}
	ts := BucketTime(r.Due, s.Resolution)
	tx.Queue("LREM", s.Keys.Bucket(r.Place(), ts), 1, r.ID)
	s.unbucketed(tx, r)
	if sp.only {
		s.dropMember(tx, Member(r.Place(), ts))
	}
}

// inBucket reports whether id is still in its bucket (the bucket is in
// the index and the list holds the id), and whether it is the bucket's
// only entry.
func (s *Store) inBucket(tx *txn.Tx, q string, ts int64, id string) (found, only bool, err error) {
	score, err := tx.Do("ZSCORE", s.Keys.Schedule(), Member(q, ts))
	if err != nil || score == nil {
		return false, false, err
	}
	ids, err := redis.Strings(tx.Do("LRANGE", s.Keys.Bucket(q, ts), 0, -1))
	if err != nil {
		return false, false, err
	}
	for _, x := range ids {
		if x == id {
			return true, len(ids) == 1, nil
		}
	}
	return false, false, nil
}

// Where says where a waiting task is.
type Where int

// Places of a task, as Lookup reports them.
const (
	InRecord Where = iota // the record's state says it all (running, done, dead, cancelled)
	InBucket              // scheduled: in its bucket
	InReady               // in its ready list, or taken by a worker that has not claimed it yet
)

// Lookup reads a task's record, its progress (Record.Progress) when it
// has run, and, for a waiting task, whether it is still in its bucket. It writes nothing; it runs in a transaction only so
// that the record and the bucket are read as of one moment.
func (s *Store) Lookup(ctx context.Context, conn redis.Conn, id string) (*Record, Where, error) {
	var (
		rec   *Record
		where Where
	)
	key := s.Keys.Task(id)
	_, err := s.runner.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
		r, err := s.getRecord(tx, id)
		if err != nil {
			return err
		}
		rec, where = r, InRecord
		if r.Runs > 0 {
			raw, err := redis.Bytes(tx.Do("GET", s.Keys.Progress(id)))
			if err != nil && !errors.Is(err, redis.ErrNil) && !IsServerError(err) {
				return err // a progress key of the wrong type is no progress
			}
			if p, err := DecodeProgress(raw); err == nil {
				r.Progress = &p
			}
		}
		if r.State != StateWaiting && r.State != StateRetry {
			return nil
		}
		sp, err := s.findSpot(tx, r)
		if err != nil {
			return err
		}
		where = InReady
		if sp.scheduled() {
			where = InBucket
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("buckets: lookup %s: %w", id, err)
	}
	return rec, where, nil
}

// DeadIDs lists dead-letter ids, newest first, from offset, at most count.
func (s *Store) DeadIDs(ctx context.Context, conn redis.Conn, offset, count int) ([]string, error) {
	ids, err := redis.Strings(do(ctx, conn, "ZREVRANGE", s.Keys.Dead(), offset, offset+count-1))
	if err != nil {
		return nil, fmt.Errorf("buckets: dead letters: %w", err)
	}
	return ids, nil
}

// DeadBefore lists up to limit dead-letter ids that died at or before
// cutoff (Unix ms), oldest first.
func (s *Store) DeadBefore(ctx context.Context, conn redis.Conn, cutoff int64, limit int) ([]string, error) {
	ids, err := redis.Strings(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Dead(), "-inf", cutoff, "LIMIT", 0, limit))
	if err != nil {
		return nil, fmt.Errorf("buckets: dead letters: %w", err)
	}
	return ids, nil
}

// Records reads records by id (MGET); a missing or undecodable one is nil
// in the result, with its error in errs.
func (s *Store) Records(ctx context.Context, conn redis.Conn, ids []string) (recs []*Record, errs []error, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	args := make([]interface{}, len(ids))
	for i, id := range ids {
		args[i] = s.Keys.Task(id)
	}
	raws, err := redis.ByteSlices(do(ctx, conn, "MGET", args...))
	if err != nil {
		return nil, nil, fmt.Errorf("buckets: read records: %w", err)
	}
	recs = make([]*Record, len(ids))
	errs = make([]error, len(ids))
	for i, raw := range raws {
		if raw == nil {
			errs[i] = fmt.Errorf("task %s: %w", ids[i], ErrNotFound)
			continue
		}
		recs[i], errs[i] = DecodeRecord(ids[i], raw)
	}
	return recs, errs, nil
}

// Purge deletes dead letters: ZREM dead ids...; DEL t:<id> ...;
// HINCRBY dead -1 per task, watching the records. Ids whose
// record is gone (expired) are removed from the index too.
func (s *Store) Purge(ctx context.Context, conn redis.Conn, ids []string) (int, error) {
	return s.deadBatch(ctx, conn, ids, func(tx *txn.Tx, r *Record) (bool, error) {
		tx.Queue("DEL", s.Keys.Task(r.ID))
		return true, nil
	})
}

func (s *Store) deadBatch(ctx context.Context, conn redis.Conn, ids []string, each func(*txn.Tx, *Record) (bool, error)) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	watch := s.Keys.Tasks(ids)
	n := 0
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		n = 0
		reps, err := getAll(tx, watch)
		if err != nil {
			return err
		}
		zrem := []interface{}{s.Keys.Dead()}
		for i, id := range ids {
			raw, _ := reps[i].([]byte)
			if raw == nil {
				zrem = append(zrem, id) // expired record
				continue
			}
			r, derr := DecodeRecord(id, raw)
			if derr != nil || r.State != StateDead {
				continue
			}
			ok, err := each(tx, r)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			zrem = append(zrem, id)
			tx.Queue("HINCRBY", s.Keys.Stats(r.Queue), StatDead, -1)
			n++
		}
		if len(zrem) > 1 {
			tx.Queue("ZREM", zrem...)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("buckets: dead letters: %w", err)
	}
	return n, nil
}

// QueueStats is one queue's figures, as Snapshot reads them, with its
// oldest ready task's record, earliest bucket and whether it is paused.
type QueueStats struct {
	QueueSnapshot
	Oldest  *Record // the oldest ready task (of its levels' pop ends); nil when none is ready
	NextDue int64   // earliest bucket time, 0 when none
	Paused  bool    // in the paused set
}

// Stats reads every known queue's counters, ready length, oldest ready
// task, earliest bucket and whether it is paused. It reads at most scanLimit index members to
// find each queue's next due bucket.
//
// A queue whose figures cannot all be read (a key of the wrong type, a
// counter that is not a number) does not hide the others: Stats returns
// every queue, with what could be read of that one (the rest zero), and an
// error that names each failed read, joined with errors.Join. A nil error
// means every figure was read.
func (s *Store) Stats(ctx context.Context, conn redis.Conn, scanLimit int) ([]QueueStats, error) {
	reps, err := pipeline(ctx, conn, []txn.Cmd{{Name: "SMEMBERS", Args: []interface{}{s.Keys.Queues()}}, {Name: "SMEMBERS", Args: []interface{}{s.Keys.Levels()}}})
	if err != nil {
		return nil, fmt.Errorf("buckets: stats: %w", err)
	}
	qs, err := redis.Strings(reps[0], asError(reps[0]))
	if err != nil {
		return nil, fmt.Errorf("buckets: stats: %w", err)
	}
	lm, err := redis.Strings(reps[1], asError(reps[1]))
	if err != nil {
		return nil, fmt.Errorf("buckets: stats: levels: %w", err)
	}
	levels := LevelPlaces(lm)
	sort.Strings(qs)
	var cmds cmdList
	for _, q := range qs {
		s.queueFigures(&cmds, q, levels)
	}
	cmds.Queue("SMEMBERS", s.Keys.Paused())
	cmds.Queue("ZRANGE", s.Keys.Schedule(), 0, scanLimit-1, "WITHSCORES")
	reps, err = pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: stats: %w", err)
	}
	var errs []error
	paused := map[string]bool{}
	if ps, err := redis.Strings(reps[len(reps)-2], nil); err == nil {
		for _, p := range ps {
			paused[p] = true
		}
	} else {
		errs = append(errs, fmt.Errorf("buckets: stats: paused set: %w", err))
	}
	next := map[string]int64{}
	ms, err := redis.Values(reps[len(reps)-1], nil)
	if err != nil {
		errs = append(errs, fmt.Errorf("buckets: stats: bucket index: %w", err))
	}
	for i := 0; i+1 < len(ms); i += 2 {
		m, _ := redis.String(ms[i], nil)
		q, ts, id, err := ParseIndexMember(m)
		if err == nil && id != "" {
			ts, err = redis.Int64(ms[i+1], nil) // an inline entry's time is its score
		}
		if q = QueueOf(q); err == nil {
			if _, ok := next[q]; !ok {
				next[q] = ts
			}
		}
	}
	out := make([]QueueStats, len(qs))
	var ids []string
	var owner []int // the queue of each of ids
	figures := reps
	for i, q := range qs {
		var snap QueueSnapshot
		snap, figures = readQueueFigures(figures, q, levels)
		if snap.Err != nil {
			errs = append(errs, snap.Err)
		}
		for _, id := range snap.OldestReady {
			ids = append(ids, id)
			owner = append(owner, i)
		}
		out[i] = QueueStats{QueueSnapshot: snap, NextDue: next[q], Paused: paused[q]}
	}
	recs, _, err := s.Records(ctx, conn, ids)
	if err != nil {
		return out, errors.Join(append(errs, err)...)
	}
	for j, r := range recs {
		// The oldest of the tasks at the pop ends of the queue's levels.
		if o := &out[owner[j]]; r != nil && (o.Oldest == nil || r.Due < o.Oldest.Due) {
			o.Oldest = r
		}
	}
	return out, errors.Join(errs...)
}
