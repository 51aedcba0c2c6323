package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Fields of a periodic entry's hash.
const (
	EntryDef   = "def"   // the definition, encoded by the engine
	EntryFP    = "fp"    // the schedule's fingerprint (what it fires on)
	EntryStamp = "stamp" // when the definition's declarer started (Unix ms); the newer definition wins
	EntryLast  = "last"  // the watermark: every firing <= last was enqueued or skipped on purpose (Unix ms)
	EntryRun   = "run"   // the id of the firing claimed last (skip-if-running entries only)
)

// PassEntry is what a declaring process knows of a periodic entry.
type PassEntry struct {
	Name  string
	Def   []byte // the definition, stored for listings and for a redefinition
	FP    string // the schedule's fingerprint
	Stamp int64  // when the declarer started, Unix ms
}

// PassPlan is what a pass enqueues, as the caller's planner decides it
// from the stored watermark.
type PassPlan struct {
	// Recs are the firings' task records, each with its deterministic ID
	// and Due the firing time.
	Recs []*Record
	// Last is the new watermark (Unix ms).
	Last int64
}

// PassResult says what a pass found and did.
type PassResult struct {
	Created    bool // the entry was not in Redis: this pass created it
	Redefined  bool // the stored definition was older: this pass replaced it
	Superseded bool // the stored definition is newer: nothing was written
	StoredFP   string
	Enqueued   []string // firing ids written
	Existing   int      // planned firings that had records already
	Cancelled  []string // enqueued firings that the redefinition cancelled
	Last       int64    // the watermark after the pass
}

// SchedulePass runs one scheduling pass of a periodic entry: one
// optimistic transaction.
//
//	WATCH   pe:<name>
//	read    HMGET pe:<name> def fp stamp last
//	        fp absent        → create the entry
//	        fp differs, stored stamp newer → Superseded: write nothing
//	        fp differs, ours newer → redefine: stale(old def, old last)
//	                           names the enqueued firings the new schedule
//	                           does not have; each is cancelled as Cancel
//	                           does (WATCH t:<id> and its bucket, GET,
//	                           LRANGE; LREM, ZREM when emptied, tombstone)
//	plan    plan(last) (last 0 for a created or redefined entry)
//	WATCH   t:<id> for every planned firing
//	read    EXISTS t:<id> (pipelined): firings with records are left alone
//	queue   the enqueue writes of the others (MSET records, SADD queues,
//	        LPUSH ready + tokens, or RPUSH bucket + ZADD sched + HINCRBY
//	        scheduled + wake), HMSET pe:<name> def fp stamp last (created or
//	        redefined; SADD periodic name) or HSET pe:<name> last,
//	        SADD pd:<name> declarer, SETEX ps:<declarer> aliveTTL 1
//
// Any number of processes may run passes of the same entry: they read the
// same watermark, the first EXEC moves it and the others' EXEC answers
// nil, and their retry plans from the new watermark. A crash before EXEC
// leaves nothing; after it, the firings and the watermark together. A
// lost reply is retried by the next pass, which finds the watermark moved.
// now is the caller's clock (Unix ms); cancelTTL is how long cancelled
// firings' tombstones are kept (seconds, at least one hour).
func (s *Store) SchedulePass(ctx context.Context, conn redis.Conn, e PassEntry, now int64, declarer string, aliveTTL, cancelTTL int64,
	plan func(last int64) PassPlan, stale func(oldDef []byte, oldLast int64) []string) (PassResult, error) {
	key := s.Keys.PeriodicEntry(e.Name)
	var res PassResult
	_, err := s.run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
		res = PassResult{}
		vals, err := redis.Values(tx.Do("HMGET", key, EntryDef, EntryFP, EntryStamp, EntryLast))
		if err != nil {
			return err
		}
		if len(vals) != 4 {
			return fmt.Errorf("HMGET %s: %d replies: %w", key, len(vals), ErrMalformed)
		}
		fp, _ := redis.String(vals[1], nil)
		stamp, _ := redis.Int64(vals[2], nil)
		last, _ := redis.Int64(vals[3], nil)
		res.StoredFP = fp
		switch {
		case vals[1] == nil:
			res.Created = true
			last = 0
		case fp != e.FP:
			if stamp > e.Stamp || (stamp == e.Stamp && fp > e.FP) {
				res.Superseded = true
				res.Last = last
				return nil
			}
			res.Redefined = true
			old, _ := redis.Bytes(vals[0], nil)
			ids := stale(old, last)
			cancelled, err := s.cancelFirings(tx, ids, now, max(cancelTTL, 3600))
			if err != nil {
				return err
			}
			res.Cancelled = cancelled
			last = 0
		}
		p := plan(last)
		free, existing, err := s.freeRecords(tx, p.Recs)
		if err != nil {
			return err
		}
		res.Existing = existing
		for _, r := range free {
			res.Enqueued = append(res.Enqueued, r.ID)
		}
		s.enqueueWrites(tx, now, free)
		res.Last = max(p.Last, last)
		if res.Created || res.Redefined {
			res.Last = max(res.Last, now)
			tx.Queue("HMSET", key, EntryDef, e.Def, EntryFP, e.FP, EntryStamp, e.Stamp, EntryLast, res.Last)
			tx.Queue("SADD", s.Keys.Periodics(), e.Name)
		} else if res.Last != last {
			tx.Queue("HSET", key, EntryLast, res.Last)
		}
		tx.Queue("SADD", s.Keys.PeriodicDeclarers(e.Name), declarer)
		tx.Queue("SETEX", s.Keys.SchedulerAlive(declarer), max(aliveTTL, 1), 1)
		return nil
	})
	if err != nil {
		return PassResult{}, fmt.Errorf("buckets: scheduling pass of %q: %w", e.Name, err)
	}
	return res, nil
}

// freeRecords watches the records of recs, reads which exist (one
// pipelined round trip) and returns those that do not, with the count of
// the others.
func (s *Store) freeRecords(tx *txn.Tx, recs []*Record) ([]*Record, int, error) {
	if len(recs) == 0 {
		return nil, 0, nil
	}
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = s.Keys.Task(r.ID)
	}
	if err := tx.Watch(keys...); err != nil {
		return nil, 0, err
	}
	for _, k := range keys {
		if err := tx.Send("EXISTS", k); err != nil {
			return nil, 0, err
		}
	}
	reps, err := tx.Flush()
	if err != nil {
		return nil, 0, err
	}
	var free []*Record
	for i, rep := range reps {
		n, err := redis.Int(rep, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("EXISTS %s: %w", keys[i], err)
		}
		if n == 0 {
			free = append(free, recs[i])
		}
	}
	return free, len(recs) - len(free), nil
}

// enqueueWrites queues the writes that enqueue recs (as Enqueue does):
// due ones (Due <= now) to their ready lists, the others to their buckets.
func (s *Store) enqueueWrites(tx queuer, now int64, recs []*Record) {
	if len(recs) == 0 {
		return
	}
	sp := s.splitEnqueue(now, recs)
	tx.Queue("MSET", sp.mset...)
	sadd := []interface{}{s.Keys.Queues()}
	for _, q := range sortedKeys(sp.queues) {
		sadd = append(sadd, q)
	}
	tx.Queue("SADD", sadd...)
	for _, q := range sortedKeys(sp.ready) {
		s.pushReady(tx, q, sp.ready[q], false)
	}
	s.scheduleBuckets(tx, sp.sched)
	if sp.earliest >= 0 {
		s.wakeDispatchers(tx, sp.earliest)
	}
}

// cancelFirings cancels, inside tx, the firings among ids that are still
// waiting (in a bucket or a ready list), as Cancel does; running,
// finished and missing ones are left alone. It returns the ids cancelled.
func (s *Store) cancelFirings(tx *txn.Tx, ids []string, now, ttl int64) ([]string, error) {
	var cancelled []string
	buckets := map[string][]string{} // bucket key → its ids, read once
	removed := map[string]int{}      // bucket key → ids removed from it
	for _, id := range ids {
		key := s.Keys.Task(id)
		if err := tx.Watch(key); err != nil {
			return nil, err
		}
		raw, err := redis.Bytes(tx.Do("GET", key))
		if errors.Is(err, redis.ErrNil) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r, err := DecodeRecord(id, raw)
		if err != nil || (r.State != StateWaiting && r.State != StateRetry) {
			continue // a bad record is the claim's to bury
		}
		ts := BucketTime(r.Due, s.Resolution)
		bucket := s.Keys.Bucket(r.Place(), ts)
		members, seen := buckets[bucket]
		if !seen {
			if err := tx.Watch(bucket); err != nil {
				return nil, err
			}
			if members, err = redis.Strings(tx.Do("LRANGE", bucket, 0, -1)); err != nil {
				return nil, err
			}
			buckets[bucket] = members
		}
		st := s.Keys.Stats(r.Queue)
		inBucket := false
		for _, m := range members {
			if m == id {
				inBucket = true
				break
			}
		}
		if inBucket {
			tx.Queue("LREM", bucket, 1, id)
			s.unbucketed(tx, r)
			removed[bucket]++
			if removed[bucket] == len(members) {
				s.dropMember(tx, Member(r.Place(), ts))
			}
		} else {
			tx.Queue("LREM", s.Keys.Ready(r.Place()), 1, id)
		}
		r.State = StateCancelled
		r.Finished = now
		r.LastError = "cancelled: the entry's schedule changed"
		tx.Queue("SETEX", key, ttl, r.Encode())
		tx.Queue("HINCRBY", st, StatCancelled, 1)
		cancelled = append(cancelled, id)
	}
	return cancelled, nil
}

// overlapTTL is how long (seconds) the tombstone of a firing skipped
// because the previous run was still running is kept.
const overlapTTL = 3600

// claimOverlap applies, inside Claim's transaction, the skip-if-running
// rule to r, a waiting firing of a periodic entry about to be claimed:
//
//	WATCH   pe:<entry>; read HGET pe:<entry> run → prev
//	WATCH   t:<prev>;   read GET t:<prev>
//	prev running → queue SETEX t:<id> tombstone ("skipped: previous run
//	               <prev> still running"), HINCRBY cancelled +1; the
//	               caller removes the id from its in-flight list
//	otherwise    → queue HSET pe:<entry> run <id>; the caller claims
//
// It reports whether r was skipped. Crash points are Claim's.
func (s *Store) claimOverlap(tx *txn.Tx, r *Record, now int64) (bool, error) {
	pe := s.Keys.PeriodicEntry(r.Periodic)
	if err := tx.Watch(pe); err != nil {
		return false, err
	}
	prev, err := redis.String(tx.Do("HGET", pe, EntryRun))
	if err != nil && !errors.Is(err, redis.ErrNil) {
		return false, err
	}
	if prev != "" && prev != r.ID {
		pk := s.Keys.Task(prev)
		if err := tx.Watch(pk); err != nil {
			return false, err
		}
		raw, err := redis.Bytes(tx.Do("GET", pk))
		if err != nil && !errors.Is(err, redis.ErrNil) && !IsWrongType(err) {
			return false, err
		}
		if p, derr := DecodeRecord(prev, raw); err == nil && derr == nil && p.State == StateRunning {
			s.skipOverlap(tx, r, now, prev)
			return true, nil
		}
	}
	tx.Queue("HSET", pe, EntryRun, r.ID)
	return false, nil
}

// skipOverlap queues the writes that make firing r a tombstone because
// run prev of its entry is still running.
func (s *Store) skipOverlap(tx queuer, r *Record, now int64, prev string) {
	st := s.Keys.Stats(r.Queue)
	r.State = StateCancelled
	r.Finished = now
	r.LastError = "skipped: previous run " + prev + " still running"
	tx.Queue("SETEX", s.Keys.Task(r.ID), overlapTTL, r.Encode())
	tx.Queue("HINCRBY", st, StatCancelled, 1)
}

// PeriodicInfo is an entry as stored, for listings.
type PeriodicInfo struct {
	Name      string
	Def       []byte
	FP        string
	Stamp     int64
	Last      int64 // the watermark
	Run       string
	Declarers []string
	Live      []bool // per declarer: its liveness key exists
}

// Periodics reads every periodic entry (SMEMBERS periodic; per entry
// HGETALL pe:<name> and SMEMBERS pd:<name>; EXISTS ps:<declarer>, each
// step pipelined). It writes nothing.
func (s *Store) Periodics(ctx context.Context, conn redis.Conn) ([]PeriodicInfo, error) {
	names, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Periodics()))
	if err != nil {
		return nil, fmt.Errorf("buckets: periodic entries: %w", err)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, nil
	}
	var reads txn.Cmds
	for _, n := range names {
		reads.Queue("HGETALL", s.Keys.PeriodicEntry(n))
		reads.Queue("SMEMBERS", s.Keys.PeriodicDeclarers(n))
	}
	reps, err := pipeline(ctx, conn, reads)
	if err != nil {
		return nil, fmt.Errorf("buckets: periodic entries: %w", err)
	}
	out := make([]PeriodicInfo, len(names))
	var alive txn.Cmds
	for i, n := range names {
		fields, err := redis.StringMap(reps[2*i], nil)
		if err != nil {
			return nil, fmt.Errorf("buckets: periodic entry %q: %w", n, err)
		}
		decl, err := redis.Strings(reps[2*i+1], nil)
		if err != nil {
			return nil, fmt.Errorf("buckets: declarers of %q: %w", n, err)
		}
		sort.Strings(decl)
		pi := PeriodicInfo{Name: n, Def: []byte(fields[EntryDef]), FP: fields[EntryFP], Run: fields[EntryRun], Declarers: decl}
		pi.Stamp, _ = strconv.ParseInt(fields[EntryStamp], 10, 64)
		pi.Last, _ = strconv.ParseInt(fields[EntryLast], 10, 64)
		for _, d := range decl {
			alive.Queue("EXISTS", s.Keys.SchedulerAlive(d))
		}
		out[i] = pi
	}
	if len(alive) == 0 {
		return out, nil
	}
	areps, err := pipeline(ctx, conn, alive)
	if err != nil {
		return nil, fmt.Errorf("buckets: periodic declarers: %w", err)
	}
	j := 0
	for i := range out {
		out[i].Live = make([]bool, len(out[i].Declarers))
		for k := range out[i].Declarers {
			n, _ := redis.Int(areps[j], nil)
			out[i].Live[k] = n == 1
			j++
		}
	}
	return out, nil
}

// PruneDeclarers removes from entry name's declarers those whose liveness
// key is gone (SMEMBERS, EXISTS pipelined, SREM). A declarer that comes
// back adds itself again in its next pass. It returns how many it removed.
func (s *Store) PruneDeclarers(ctx context.Context, conn redis.Conn, name string) (int, error) {
	key := s.Keys.PeriodicDeclarers(name)
	decl, err := redis.Strings(do(ctx, conn, "SMEMBERS", key))
	if err != nil || len(decl) == 0 {
		return 0, wrapPrune(name, err)
	}
	var reads txn.Cmds
	for _, d := range decl {
		reads.Queue("EXISTS", s.Keys.SchedulerAlive(d))
	}
	reps, err := pipeline(ctx, conn, reads)
	if err != nil {
		return 0, wrapPrune(name, err)
	}
	args := []interface{}{key}
	for i, d := range decl {
		if n, _ := redis.Int(reps[i], nil); n == 0 {
			args = append(args, d)
		}
	}
	if len(args) == 1 {
		return 0, nil
	}
	n, err := redis.Int(do(ctx, conn, "SREM", args...))
	return n, wrapPrune(name, err)
}

func wrapPrune(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("buckets: pruning the declarers of %q: %w", name, err)
}
