package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Reason says why running tasks are returned to their queues.
type Reason int

// Reasons for Requeue.
const (
	// Shutdown: the worker stops and gives its unfinished tasks back. Not
	// counted as a recovery.
	Shutdown Reason = iota
	// WorkerDied: the worker's heartbeat is gone.
	WorkerDied
	// LeaseExpired: the task ran past its lease (a hung handler).
	LeaseExpired
	// Unstarted: the worker claimed the task ahead of a free handler slot
	// (prefetch) and gives it back without having started it: it stops,
	// or the task waited too long for a slot. Not counted as a recovery.
	Unstarted
)

// counted reports whether a return for this reason counts as a recovery
// (and can send a task to the dead letters): the task may have started.
func (r Reason) counted() bool { return r != Shutdown && r != Unstarted }

func (r Reason) String() string {
	switch r {
	case Shutdown:
		return "returned at shutdown"
	case WorkerDied:
		return "worker died while running it"
	case LeaseExpired:
		return "lease expired while running it"
	case Unstarted:
		return "returned before it started"
	}
	return "unknown reason"
}

// RequeueResult counts what Requeue and RecoverAllInflight did.
type RequeueResult struct {
	Requeued int // back in a ready list
	Buried   int // to the dead letters (too many recoveries, or a missing or bad record)
	Dropped  int // ids no longer this worker's (already handled elsewhere), or whose lease was renewed
	// Alive is set when the worker was taken for dead (WorkerDied, or
	// RecoverAllInflight with requireDead) but its heartbeat was back by
	// the transaction: nothing was returned.
	Alive bool
	// Recovered names the tasks Requeue counted as recovered (WorkerDied,
	// LeaseExpired), Buried set for those sent to the dead letters for it.
	Recovered []RecoveredTask
}

// RecoveredTask is a task Requeue counted as recovered.
type RecoveredTask struct {
	ID, Queue, Type string
	Buried          bool // recovered too many times: now a dead letter
}

// Requeue returns running tasks of worker w to the front of their ready
// lists. For WorkerDied and LeaseExpired it counts a recovery, and a task
// recovered more than maxRecoveries times goes to the dead letters instead
// (a task that keeps killing its worker must not kill them all).
//
// WATCH   p:<w>, t:<id> ...
// read    GET t:<id>, ZSCORE p:<w> id   (pipelined, per id)
// queue   ZREM p:<w> ids...; per task still running under w:
//
//	SET t:<id> waiting; RPUSH q:<q> (front) + tokens; or bury;
//	HINCRBY running -1, recovered +1; a run that holds a slot gives
//	it back (releaseSlot: DECR sl:<q>, a token on sw:<q>)
//	a missing or malformed record becomes a dead letter saying so
//	(of no queue: burying never invents one; the raw bytes as payload);
//	a record no longer
//	running under w is someone else's and is left alone.
//
// The judgement that made the caller return the tasks is made again
// inside the transaction, since a reaper reads it earlier, outside:
// for WorkerDied the transaction also watches and reads hb:<w> (EXISTS),
// and a worker whose heartbeat is back (it beat again after a server
// restart that had expired its key, say) keeps everything (Alive); for
// LeaseExpired an id whose lease deadline (its score) is past now was
// renewed since, and stays (Dropped).
//
// Two reapers at once: the second one's EXEC fails because the first
// changed p:<w> and the records, and its next read finds the ids gone from
// p:<w>: each task is returned once. A crash before EXEC changes nothing.
func (s *Store) Requeue(ctx context.Context, conn redis.Conn, w string, ids []string, now int64, why Reason, maxRecoveries int) (RequeueResult, error) {
	if len(ids) == 0 {
		return RequeueResult{}, nil
	}
	pending, hb := s.Keys.Pending(w), s.Keys.Heartbeat(w)
	watch := []string{pending}
	if why == WorkerDied {
		watch = append(watch, hb)
	}
	for _, id := range ids {
		watch = append(watch, s.Keys.Task(id))
	}
	var res RequeueResult
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		res = RequeueResult{}
		views := FlowViews{}
		for _, id := range ids {
			if err := tx.Send("GET", s.Keys.Task(id)); err != nil {
				return err
			}
			if err := tx.Send("ZSCORE", pending, id); err != nil {
				return err
			}
		}
		if why == WorkerDied {
			if err := tx.Send("EXISTS", hb); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		if why == WorkerDied {
			if alive, err := redis.Int(reps[2*len(ids)], nil); err != nil || alive == 1 {
				res.Alive, res.Dropped = err == nil, len(ids)
				return err
			}
		}
		zrem := []interface{}{pending}
		var back byQueue
		for i, id := range ids {
			raw, score := reps[2*i], reps[2*i+1]
			if score == nil {
				res.Dropped++
				continue
			}
			if why == LeaseExpired {
				if deadline, err := redis.Float64(score, nil); err != nil || deadline > float64(now) {
					res.Dropped++ // renewed since it was listed (or unreadable: left to check)
					continue
				}
			}
			zrem = append(zrem, id)
			b, _ := raw.([]byte)
			// A missing or undecodable record cannot run again: it
			// becomes a dead letter saying so, of no queue (a pending set
			// holds only ids, and burying never invents a queue), never a
			// silent drop.
			r, derr := s.readable(tx, id, "", b, now)
			if derr != nil {
				res.Buried++
				continue
			}
			if r.State != StateRunning || r.Worker != w {
				// The pending entry outlived its run; the record is
				// someone else's business now.
				res.Dropped++
				continue
			}
			st := s.Keys.Stats(r.Queue)
			tx.Queue("HINCRBY", st, StatRunning, -1)
			s.releaseSlot(tx, r, now)
			r.Worker = ""
			r.Deadline = 0
			if why.counted() {
				r.Recoveries++
				tx.Queue("HINCRBY", st, StatRecovered, 1)
				res.Recovered = append(res.Recovered, RecoveredTask{ID: id, Queue: r.Queue, Type: r.Type, Buried: r.Recoveries > maxRecoveries})
				if r.Recoveries > maxRecoveries {
					if err := s.flowRead(tx, r, views); err != nil {
						return err
					}
					r.LastError = fmt.Sprintf("%s %d times (limit %d)", why, r.Recoveries, maxRecoveries)
					s.bury(tx, r, now, r.LastError)
					res.Buried++
					continue
				}
			}
			r.State = StateWaiting
			tx.Queue("SET", s.Keys.Task(id), r.Encode())
			back.add(r.Place(), id)
			res.Requeued++
		}
		back.pushFront(s, tx)
		if len(zrem) > 1 {
			tx.Queue("ZREM", zrem...)
		}
		return nil
	})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("buckets: requeue %d tasks of %s: %w", len(ids), w, err)
	}
	return res, nil
}

// PendingIDs lists up to limit ids in worker w's pending set whose lease
// deadline is at or before cutoff (Unix ms): ZRANGEBYSCORE p:<w> -inf
// cutoff LIMIT 0 limit. Use cutoff "+inf" semantics with a huge value to
// list them all.
func (s *Store) PendingIDs(ctx context.Context, conn redis.Conn, w string, cutoff int64, limit int) ([]string, error) {
	ids, err := redis.Strings(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Pending(w), "-inf", cutoff, "LIMIT", 0, limit))
	if err != nil {
		return nil, fmt.Errorf("buckets: pending of %s: %w", w, err)
	}
	return ids, nil
}

// recoverInflight returns up to limit ids from worker w's in-flight
// list (taken, never claimed) to the front of their ready lists. These
// tasks never started, so no recovery is counted. With requireDead (a
// reaper), w must still be dead: hb:<w> is watched and read too, and a
// worker whose heartbeat is back keeps its list (Alive).
//
// WATCH   f:<w> (requireDead: hb:<w>), then t:<id> ... for the ids read
// read    (requireDead: EXISTS hb:<w>), LRANGE f:<w> -limit -1, GET t:<id> ...
// queue   LTRIM f:<w> 0 -(n+1); RPUSH q:<q> ids (front) + tokens;
//
//	a missing or malformed record becomes a dead letter saying so;
//	a cancelled or no longer waiting task is dropped.
//
// Only reapers touch a dead worker's list, and watching it and the records
// makes a second reaper, or a Cancel, start over.
func (s *Store) recoverInflight(ctx context.Context, conn redis.Conn, w string, now int64, limit int, requireDead bool) (RequeueResult, error) {
	inflight, hb := s.Keys.Inflight(w), s.Keys.Heartbeat(w)
	watch := []string{inflight}
	if requireDead {
		watch = append(watch, hb)
	}
	var res RequeueResult
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		res = RequeueResult{}
		if requireDead {
			alive, err := redis.Int(tx.Do("EXISTS", hb))
			if err != nil || alive == 1 {
				res.Alive = err == nil
				return err
			}
		}
		ids, err := redis.Strings(tx.Do("LRANGE", inflight, -limit, -1))
		if err != nil || len(ids) == 0 {
			return err
		}
		reps, err := watchGetAll(tx, s.Keys.Tasks(ids))
		if err != nil {
			return err
		}
		if err := s.requeueRead(tx, ids, reps, now, &res, nil); err != nil {
			return err
		}
		tx.Queue("LTRIM", inflight, 0, -(len(ids) + 1))
		return nil
	})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("buckets: recover in-flight of %s: %w", w, err)
	}
	return res, nil
}

// requeueRead sorts the records read for ids (reps[i] answers ids[i]),
// walking from the last (the oldest of a list pushed at its head), and
// queues on tx what becomes of each, counting it in res: a record key of
// another type is set aside and the id buried (of no queue: an in-flight
// list does not say where the id came from); a record that cannot be read
// is buried; a task waiting or to retry goes back to the front of its
// ready list, the oldest first; any other is dropped. skip, when set, is
// called first with each id and drops it when it returns true. An error
// reply other than a wrong type (LOADING, say) is returned: nothing is
// judged.
func (s *Store) requeueRead(tx *txn.Tx, ids []string, reps []interface{}, now int64, res *RequeueResult, skip func(id string) bool) error {
	var back byQueue
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if skip != nil && skip(id) {
			continue
		}
		if e := asError(reps[i]); e != nil && !IsWrongType(e) {
			return e
		}
		if IsWrongType(asError(reps[i])) {
			if err := s.buryWrongType(tx, id, "", now); err != nil {
				return err
			}
			res.Buried++
			continue
		}
		raw, _ := reps[i].([]byte)
		r, derr := s.readable(tx, id, "", raw, now)
		if derr != nil {
			res.Buried++
			continue
		}
		if r.State != StateWaiting && r.State != StateRetry {
			res.Dropped++
			continue
		}
		back.add(r.Place(), id)
		res.Requeued++
	}
	back.pushFront(s, tx)
	return nil
}

// byQueue gathers ids going back to their ready lists, queue by queue, the
// queues in the order first seen.
type byQueue struct {
	ids    map[string][]string
	queues []string
}

func (b *byQueue) add(q, id string) {
	if b.ids == nil {
		b.ids = map[string][]string{}
	}
	if len(b.ids[q]) == 0 {
		b.queues = append(b.queues, q)
	}
	b.ids[q] = append(b.ids[q], id)
}

// pushFront queues on tx the push of every gathered id to the front of its
// queue's ready list, in the order added.
func (b *byQueue) pushFront(s *Store, tx queuer) {
	for _, q := range b.queues {
		s.pushReady(tx, q, b.ids[q], true)
	}
}

// getAll reads keys in one round trip (a GET each, pipelined on tx):
// reps[i] answers keys[i].
func getAll(tx *txn.Tx, keys []string) ([]interface{}, error) {
	for _, k := range keys {
		if err := tx.Send("GET", k); err != nil {
			return nil, err
		}
	}
	return tx.Flush()
}

// watchGetAll watches keys, then reads them as getAll does.
func watchGetAll(tx *txn.Tx, keys []string) ([]interface{}, error) {
	if err := tx.Watch(keys...); err != nil {
		return nil, err
	}
	return getAll(tx, keys)
}

func asError(rep interface{}) error {
	err, _ := rep.(error)
	return err
}

// RecoverAllInflight runs recoverInflight until worker w's in-flight list
// is empty (or, with requireDead, w is found alive), and adds up what it
// did. A reaper sets requireDead; a worker emptying its own list does not.
func (s *Store) RecoverAllInflight(ctx context.Context, conn redis.Conn, w string, now int64, requireDead bool) (RequeueResult, error) {
	var total RequeueResult
	for {
		res, err := s.recoverInflight(ctx, conn, w, now, 100, requireDead)
		total.Requeued += res.Requeued
		total.Buried += res.Buried
		total.Dropped += res.Dropped
		total.Alive = res.Alive
		if err != nil || res.Alive || res.Requeued+res.Buried+res.Dropped == 0 {
			return total, err
		}
	}
}

// Beat proves worker process w alive for ttl seconds and keeps it in the
// registry: MULTI; SETEX hb:<w> ttl info; SADD w <w>; EXEC. Re-adding on
// every beat matters: a process that was cut off longer than its TTL may
// have been forgotten by a reaper, and must be found again if it dies.
//
// For each Served given it also says which task types w serves, in the
// same MULTI: SETEX ty:<q>:<type> ttl 1 per type; HDEL un:<q> types...
// (those types are served again).
func (s *Store) Beat(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...Served) error {
	var cmds cmdList
	cmds.Queue("SETEX", s.Keys.Heartbeat(w), ttl, info)
	cmds.Queue("SADD", s.Keys.Workers(), w)
	for _, sv := range served {
		if len(sv.Types) == 0 {
			continue
		}
		hdel := []interface{}{s.Keys.Unserved(sv.Queue)}
		for _, t := range sv.Types {
			cmds.Queue("SETEX", s.Keys.Served(sv.Queue, t), max(sv.TTL, 1), "1")
			hdel = append(hdel, t)
		}
		cmds.Queue("HDEL", hdel...)
	}
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: heartbeat %s: %w", w, err)
	}
	return nil
}

// Refresh renews the heartbeat of worker w while the key an earlier Beat
// wrote still exists: SETEX hb:<w> ttl info, and for each Served SETEX
// ty:<q>:<type> ttl 1 per type, those in one MULTI with the heartbeat
// (a single SETEX alone has none). It leaves out what Beat re-asserts
// (SADD w <w>, HDEL un:<q> types): the caller sends a Beat instead
// whenever the heartbeat key may have expired since the last beat, since
// a reaper may then have forgotten w. A crash before EXEC leaves the old
// keys to expire, as a missed beat does; after it, all are renewed.
func (s *Store) Refresh(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...Served) error {
	var cmds cmdList
	cmds.Queue("SETEX", s.Keys.Heartbeat(w), ttl, info)
	for _, sv := range served {
		for _, t := range sv.Types {
			cmds.Queue("SETEX", s.Keys.Served(sv.Queue, t), max(sv.TTL, 1), "1")
		}
	}
	var err error
	if len(cmds) == 1 {
		_, err = do(ctx, conn, cmds[0].Name, cmds[0].Args...)
	} else {
		_, err = s.exec(ctx, conn, cmds)
	}
	if err != nil {
		return fmt.Errorf("buckets: heartbeat %s: %w", w, err)
	}
	return nil
}

// Workers lists the registered worker processes and whether each one's
// heartbeat key exists (SMEMBERS w, then EXISTS hb:<w> pipelined). The
// heartbeat's TTL is kept by the server, so no clocks are compared.
func (s *Store) Workers(ctx context.Context, conn redis.Conn) (ids []string, alive []bool, err error) {
	ids, err = redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Workers()))
	if err != nil || len(ids) == 0 {
		return nil, nil, wrapErr("workers", err)
	}
	var cmds cmdList
	for _, w := range ids {
		cmds.Queue("EXISTS", s.Keys.Heartbeat(w))
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, nil, wrapErr("workers", err)
	}
	alive = make([]bool, len(ids))
	for i, r := range reps {
		n, _ := redis.Int(r, nil)
		alive[i] = n == 1
	}
	return ids, alive, nil
}

// Forget removes worker w from the registry if its heartbeat is gone and
// it holds nothing: WATCH hb:<w> f:<w> p:<w>; EXISTS, LLEN, ZCARD; MULTI;
// SREM w <w>; DEL hb:<w>; EXEC. A beat in between (a process that came
// back) makes EXEC fail. It reports whether w was removed. If any of the
// three reads fails (a key of the wrong type), w is kept and the error
// returned: an unreadable list is never taken for an empty one.
func (s *Store) Forget(ctx context.Context, conn redis.Conn, w string, requireDead bool) (bool, error) {
	hb, f, p := s.Keys.Heartbeat(w), s.Keys.Inflight(w), s.Keys.Pending(w)
	removed := false
	_, err := s.runner.Run(ctx, conn, []string{hb, f, p}, func(tx *txn.Tx) error {
		removed = false
		for _, c := range []txn.Cmd{{Name: "EXISTS", Args: []interface{}{hb}}, {Name: "LLEN", Args: []interface{}{f}}, {Name: "ZCARD", Args: []interface{}{p}}} {
			if err := tx.Send(c.Name, c.Args...); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		// An error reply (f:<w> or p:<w> of the wrong type, say) must not
		// read as "empty": that would forget a worker that may still hold
		// tasks, and no reaper would look for them again.
		var n [3]int
		for i, what := range []string{"heartbeat", "in-flight list", "pending set"} {
			if n[i], err = redis.Int(reps[i], nil); err != nil {
				return fmt.Errorf("read %s of %s: %w", what, w, err)
			}
		}
		alive, nf, np := n[0], n[1], n[2]
		if (requireDead && alive == 1) || nf > 0 || np > 0 {
			return nil
		}
		tx.Queue("SREM", s.Keys.Workers(), w)
		tx.Queue("DEL", hb)
		removed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("buckets: forget %s: %w", w, err)
	}
	return removed, nil
}

func wrapErr(what string, err error) error {
	if err == nil || errors.Is(err, redis.ErrNil) {
		return nil
	}
	return fmt.Errorf("buckets: %s: %w", what, err)
}

// RecoverLost returns up to limit ids from live worker w's in-flight list
// that the worker does not hold (taken by a pop whose reply was lost, or
// given back by a claim that could not be made) to the front of their
// ready lists. held is called inside each attempt, after the list is read,
// and returns the ids the worker's slots hold between a pop and its
// claim; those stay.
//
// WATCH   f:<w>, then t:<id> ... for the ids read and not held
// read    LRANGE f:<w> -limit -1 (the oldest), GET t:<id> ...
// queue   LREM f:<w> 1 id per id returned; RPUSH q:<q> ids (front) +
//
//	tokens; a missing, malformed or wrong-typed record becomes a dead
//	letter saying so (of no queue: the list does not say where the id
//	came from); a cancelled or no longer waiting task is dropped.
//
// A slot's claim changes f:<w> and the record: the attempt starts over. A
// crash before EXEC changes nothing.
func (s *Store) RecoverLost(ctx context.Context, conn redis.Conn, w string, now int64, limit int, held func() map[string]int) (RequeueResult, error) {
	inflight := s.Keys.Inflight(w)
	var res RequeueResult
	_, err := s.run(ctx, conn, []string{inflight}, func(tx *txn.Tx) error {
		res = RequeueResult{}
		all, err := redis.Strings(tx.Do("LRANGE", inflight, -limit, -1))
		if err != nil || len(all) == 0 {
			return err
		}
		h := held()
		var ids []string
		for _, id := range all {
			if h[id] > 0 {
				h[id]--
				continue
			}
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return nil
		}
		reps, err := watchGetAll(tx, s.Keys.Tasks(ids))
		if err != nil {
			return err
		}
		seen := map[string]bool{} // ids handled: the list may hold one twice
		return s.requeueRead(tx, ids, reps, now, &res, func(id string) bool {
			tx.Queue("LREM", inflight, 1, id)
			if seen[id] {
				res.Dropped++ // a second copy of the same id
				return true
			}
			seen[id] = true
			return false
		})
	})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("buckets: recover lost pops of %s: %w", w, err)
	}
	return res, nil
}
