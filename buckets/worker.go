package buckets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Pop takes the oldest ready task of queue q into worker process w's
// in-flight list in one atomic command (RPOPLPUSH q:<q> f:<w>), so that a
// task is never only in the memory of a process: if the connection drops
// or the process dies after this, the id is in f:<w> and the reaper returns
// it. It returns "" when the queue is empty.
func (s *Store) Pop(ctx context.Context, conn redis.Conn, q, w string) (string, error) {
	id, err := redis.String(do(ctx, conn, "RPOPLPUSH", s.Keys.Ready(q), s.Keys.Inflight(w)))
	if errors.Is(err, redis.ErrNil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("buckets: pop %s: %w", q, err)
	}
	return id, nil
}

// PopNext is Pop as a command to send behind FinishHeld's EXEC, in the
// same round trip: its reply is the id taken into w's in-flight list, or
// nil when queue q is empty.
func (s *Store) PopNext(q, w string) txn.Cmd {
	return txn.Cmd{Name: "RPOPLPUSH", Args: []interface{}{s.Keys.Ready(q), s.Keys.Inflight(w)}}
}

// ClaimState is what a claim attempt wrote, kept by the caller across
// retries of the claim of one popped id, and the watch a holding claim
// left on its connection.
type ClaimState struct {
	// Serves, when set, tells the task types the worker has a handler
	// for: a task of another type is given back (NotServed) instead of
	// claimed, unless no live worker has served its type on the queue for
	// UnservedGrace ms (see Claim).
	Serves        func(typ string) bool
	UnservedGrace int64
	// Limits is the worker's view of the queue's flow control (its last
	// read of Keys.Limit). When it limits anything, the claim watches and
	// reads the queue's limits, slots and window, and its key's, and
	// takes what the task needs or gives it back (Full, Throttled,
	// KeyFull, KeyThrottled). Claim reads them all; ClaimBatch reads only the slots,
	// and is for a queue whose Limits are not Single.
	Limits Limits
	// Until is, after a claim that gave the task back for its flow
	// control, when to look again (Unix ms).
	Until int64
	// Free is, after a claim that read the queue's concurrency limit
	// (Limits.MaxRunning), the slots of it the claim left free: how far
	// the limit is from binding, which the worker's claiming ahead
	// depends on.
	Free int64

	runs   int
	held   *txn.Held
	waited bool
}

// Waited is whether the last successful Claim with hold set found the
// task marked as waited for (Keys.Waiter), for FinishHeld; the held watch
// covers the mark.
func (cs *ClaimState) Waited() bool { return cs.waited }

// Held is the watch that the last successful Claim with hold set left on
// the record, for FinishHeld; nil if it left none.
func (cs *ClaimState) Held() *txn.Held { return cs.held }

// ClaimResult says what Claim found.
type ClaimResult int

// Claim outcomes.
const (
	Claimed      ClaimResult = iota // the task is now running under this worker
	Skipped                         // cancelled, or an id whose task is not waiting; dropped
	Buried                          // record missing or malformed; a dead letter now says so
	Paused                          // the queue is paused: the id is back at the pop end of its ready list
	NotServed                       // a type the worker does not serve: the id is back at the pop end, for another worker
	Expired                         // not started by its expiry: a dead letter now, reason ReasonExpired
	Full                            // every slot of the queue's concurrency limit is in use: the id is back at the pop end
	Throttled                       // the queue's rate window is full: the id is back at the pop end (until ClaimState.Until)
	KeyFull                         // every slot of its key is in use: the id is back at the pop end, the key out of turn until a slot of it is freed
	KeyThrottled                    // its key's rate window is full: the id is back at the pop end, the key out of turn until ClaimState.Until
)

// Claim records a popped task as running under worker w, or drops it.
//
// WATCH   t:<id>
// read    GET t:<id>
// queue   (waiting or retrying)  SET t:<id> running; ZADD p:<w> deadline id;
//
//	SADD w <w>; LREM f:<w> 1 id; HINCRBY st running +1 (retrying -1)
//	(cancelled, not waiting)  LREM f:<w> 1 id
//	(missing, malformed)      LREM f:<w> 1 id; SET t:<id> dead record
//	                          saying why; ZADD dead; HINCRBY st dead +1
//	(past Record.ExpireAt)    the same burial, reason "expired: ...",
//	                          and HINCRBY st expired +1
//
// The paused set is watched too, and read with the record (SISMEMBER
// paused q): a claimable task of a paused queue goes back instead,
//
//	(paused)  LREM f:<w> 1 id; RPUSH q:<q> id
//
// so that no task of a queue is claimed after Pause's EXEC. When cs.Serves
// says the worker has no handler for the task's type, the claim reads
// EXISTS ty:<q>:<type> and HGET un:<q> type (not watched: a stale answer
// only gives a task back once more, or applies the policy once early)
// and gives the task back for a worker that serves it, waking one:
//
//	(not served)  LREM f:<w> 1 id; RPUSH q:<q> id; LPUSH n:<q> 1; LTRIM n:<q>;
//	              HSETNX un:<q> type now (when no live worker serves it)
//
// unless no live worker serves the type and it was first seen unserved
// at least cs.UnservedGrace ms ago: then it is claimed, and the handler's
// ErrNoHandler meets the unknown-type policy.
//
// When cs.Limits limits anything, the claim also watches the queue's
// flow-control keys (lim:<q>, sl:<q>, rl:<q>, and for a key's place
// ks:<q>#<key>, rl:<q>#<key>) and reads them with the record
// (sendFlowReads). A claimable task that may not start goes back:
//
//	(full, throttled)  LREM f:<w> 1 id; RPUSH q:<place> id
//	(key full)         the same; ZINCRBY kr:<p> 0 key; ZREM kr:<p> key
//	(key throttled)    the same; ZINCRBY kr:<p> 0 key; ZADD kr:<p> until key
//
// and a claimed one takes what its limits count in the same MULTI (take:
// INCR sl:<q>; LPUSH/LTRIM rl:<q>; SADD ks:<q>#<key> id; LPUSH/LTRIM
// rl:<q>#<key>), its record saying which slots it holds
// (Record.HoldsSlot, HoldsKeySlot). A crash before EXEC takes nothing;
// after it, the slots are the record's, given back by whatever takes the
// record out of running (releaseSlot), the reaper's Requeue included.
//
// A firing of a skip-if-running periodic entry also goes through
// claimOverlap (periodic.go), which may make it a cancelled tombstone
// instead (result Skipped).
//
// The SADD keeps the registry holding w whenever p:<w> holds an id: a
// worker cut off from Redis past its heartbeat's TTL may have been found
// dead and forgotten by a reaper (Forget), and a claim it retries once it
// is back, before its next full beat, would otherwise put the task where
// no reaper looks if the worker then died. Forget watches p:<w>, so it
// either runs before this EXEC (which registers w again) or sees the
// claim and keeps w. Adding a member already there changes nothing.
//
// A Cancel that wins the race changes t:<id> first and this attempt reads
// the tombstone again; a Cancel that loses sees "running". A crash before
// EXEC leaves the id in f:<w>, where the reaper finds it once w's heartbeat
// is gone. deadline computes the lease deadline from the record.
//
// With hold set (and cs given), the claim also watches and reads the
// task's waiter mark (WATCH cw:<id> too; the reads are MGET t:<id>
// cw:<id>, and GET t:<id> again when MGET answers nil, to tell a missing
// record from a key of another type), and a claimed task's record and
// mark are WATCHed again right after EXEC, in the same round trip; the
// watch is left on conn for FinishHeld, as cs.Held(), and the mark read
// as cs.Waited(): the caller must run nothing else on conn until then.
//
// A claim whose EXEC reply was lost (the connection dropped) is retried
// by the caller with the same ClaimState: the retry then recognises its
// own committed claim (running under w, with the run number it wrote)
// and returns Claimed, instead of taking it for someone else's.
func (s *Store) Claim(ctx context.Context, conn redis.Conn, w, q, id string, now int64, deadline func(*Record) int64, hold bool, cs *ClaimState) (*Record, ClaimResult, error) {
	key := s.Keys.Task(id)
	var (
		rec    *Record
		result ClaimResult
	)
	var held *txn.Held
	if cs != nil {
		cs.held = nil
	}
	hold = hold && cs != nil
	waiter := s.Keys.Waiter(id)
	watch := []string{key, s.Keys.Paused()}
	if hold {
		watch = append(watch, waiter)
	}
	var view Limits
	if cs != nil {
		view = cs.Limits
		cs.Until = 0
	}
	limited := view.Limited()
	if limited {
		watch = append(watch, s.flowWatch(q)...)
	}
	waited := false
	reps, err := s.runner.Run(ctx, conn, watch, func(tx *txn.Tx) error {
		rec, result, held, waited = nil, Skipped, nil, false
		var err error
		if hold {
			err = s.sendRecords(tx, []string{id}, true, []string{key}, []string{waiter})
		} else {
			err = tx.Send("GET", key)
		}
		if err != nil {
			return err
		}
		if err := tx.Send("SISMEMBER", s.Keys.Paused(), QueueOf(q)); err != nil {
			return err
		}
		want := 2
		if limited {
			n, err := s.sendFlowReads(tx, q, view)
			if err != nil {
				return err
			}
			want += n
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		if len(reps) != want {
			return fmt.Errorf("%d replies to %d reads", len(reps), want)
		}
		paused, perr := redis.Int(reps[1], nil)
		if perr != nil {
			return perr
		}
		var flow *flowBudget
		if limited {
			if flow, err = s.flowBudgetOf(tx, q, view, reps[2:]); err != nil {
				return err
			}
		}
		rep := reps[0]
		if hold {
			recs, marked, rerr := s.recordReplies(tx, []string{id}, true, rep)
			if rerr != nil {
				return rerr
			}
			rep, waited = recs[0], marked[0]
		}
		var derr error
		rec, result, derr = s.claimDecide(claimTx{tx: tx, wq: tx, a: s.workerArgs(w), q: q, paused: paused == 1, flow: flow, now: now, deadline: deadline}, id, key, rep, cs)
		if derr != nil {
			return derr
		}
		if cs != nil && flow != nil {
			cs.Free = flow.free
		}
		if result == Claimed && hold && !rec.FlowReads() {
			held = tx.Hold(key, waiter)
		}
		return nil
	})
	if err != nil && (result == Paused || result == NotServed || result == Full || result == Throttled || result == KeyFull || result == KeyThrottled) {
		// The id went back to a ready list of the wrong type: EXEC ran
		// its LREM from the in-flight list all the same (no rollback).
		// Set the list aside and push the id again, or it is in no list.
		// (No watch is held for a task given back.)
		if ok, rerr := s.repairPlacement(ctx, conn, reps, err); rerr == nil && ok {
			err = nil
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("buckets: claim %s: %w", id, err)
	}
	if cs != nil {
		cs.held, cs.waited = held, waited
	}
	return rec, result, nil
}

// claimTx is what the decisions of one claim transaction share: the
// transaction, where its writes go (tx itself, or a list the batch
// coalesces), the worker, the place the ids were popped from, whether its
// queue is paused, its flow control (nil: no limit, or not read), the
// time, the lease deadline of a record, and a ClaimBatch's state (nil
// in Claim).
type claimTx struct {
	tx       *txn.Tx
	wq       queuer
	a        *workerArgs
	q        string
	paused   bool
	flow     *flowBudget
	now      int64
	deadline func(*Record) int64
	batch    *batchState
}

// claimDecide decides, inside a claim's transaction that watches t:<id>
// and the paused set, what becomes of popped id given rep, the reply to
// GET t:<id>, whether queue q is paused and its flow control (nil: no
// limit, or the claim did not read it); it queues the writes that
// say so (see Claim) and returns the claimed record, if any. cs may be
// nil. batch is the state of a ClaimBatch (nil in Claim). Its own writes
// go to wq (tx itself, or a list the batch coalesces); the helpers that
// read as they go (a wrong-type record, an unserved type, the overlap
// rule) queue theirs on tx, on keys no other write of the batch orders
// against, or counters.
func (s *Store) claimDecide(c claimTx, id, key string, rep interface{}, cs *ClaimState) (*Record, ClaimResult, error) {
	tx, wq, a, q, paused, flow, now, deadline, batch := c.tx, c.wq, c.a, c.q, c.paused, c.flow, c.now, c.deadline, c.batch
	w := a.w
	idArg := interface{}(id) // boxed once for the writes below
	rec, result := (*Record)(nil), Skipped
	queue := QueueOf(q) // q is the place the id was popped from
	raw, err := redis.Bytes(rep, asError(rep))
	if IsWrongType(err) {
		// The record key holds another type (written by hand, say):
		// it can never run. Set it aside and say so in a dead letter.
		if err := s.buryWrongType(tx, id, queue, now); err != nil {
			return nil, 0, err
		}
		wq.Queue("LREM", a.Inflight(), 1, idArg)
		return nil, Buried, nil
	}
	if err != nil && !errors.Is(err, redis.ErrNil) {
		return nil, 0, err
	}
	if r, derr := s.readable(wq, id, queue, raw, now); derr != nil {
		result = Buried
	} else if cs != nil && cs.runs > 0 && r.State == StateRunning && r.Worker == w && r.Runs == cs.runs {
		rec, result = r, Claimed // our own claim, whose reply was lost
	} else if (r.State == StateWaiting || r.State == StateRetry) && paused {
		wq.Queue("LREM", a.Inflight(), 1, idArg)
		batch.giveBack(wq, s, q, id)
		return nil, Paused, nil
	} else if (r.State == StateWaiting || r.State == StateRetry) && r.ExpireAt != 0 && now > r.ExpireAt && r.Flow == nil {
		// Past its expiry: never started, a dead letter saying so.
		wq.Queue("HINCRBY", a.Stats(r.Queue), StatExpired, 1)
		s.bury(wq, r, now, fmt.Sprintf("%s: not started by %s", ReasonExpired, time.UnixMilli(r.ExpireAt).UTC().Format(time.RFC3339Nano)))
		result = Expired
	} else if r.State == StateWaiting || r.State == StateRetry {
		if cs != nil && cs.Serves != nil && !cs.Serves(r.Type) {
			back, err := s.unserved(tx, queue, r.Type, now, cs.UnservedGrace)
			if err != nil {
				return nil, 0, err
			}
			if back {
				wq.Queue("LREM", a.Inflight(), 1, idArg)
				batch.giveBack(wq, s, q, id)
				s.queueTokens(wq, s.Keys.Notify(queue), 1, "1")
				return nil, NotServed, nil
			}
		}
		flow := flow
		if r.Queue != queue {
			flow = nil // not a task of the queue whose limits were read
		}
		if res, until := flow.check(r.Key, now); res != Claimed {
			wq.Queue("HINCRBY", a.Stats(r.Queue), StatHeld, 1)
			wq.Queue("LREM", a.Inflight(), 1, idArg)
			batch.giveBack(wq, s, q, id)
			switch p, _ := SplitKey(q); res {
			case KeyFull:
				// Out of turn until a slot of it is freed: the release
				// puts it back (ZADD now), and only a running task of
				// the key holds one.
				wq.Queue("ZREM", s.Keys.Rotation(p), r.Key)
			case KeyThrottled:
				wq.Queue("ZADD", s.Keys.Rotation(p), until, r.Key)
			}
			if cs != nil {
				cs.Until = until
			}
			return nil, res, nil
		}
		if r.SkipIfRunning && r.Periodic != "" {
			// The overlap rule of a periodic entry (periodic.go).
			var skip bool
			if prev := batch.run(r.Periodic); prev != "" {
				s.skipOverlap(wq, r, now, prev)
				skip = true
			} else if skip, err = s.claimOverlap(tx, r, now); err != nil {
				return nil, 0, err
			}
			if skip {
				wq.Queue("LREM", a.Inflight(), 1, idArg)
				return nil, Skipped, nil
			}
			batch.claimedRun(r.Periodic, r.ID)
		}
		s.take(wq, flow, r, now)
		r.State = StateRunning
		r.Runs++
		r.Worker = w
		r.Started = now
		r.Deadline = deadline(r)
		wq.Queue("SET", key, r.Encode())
		wq.Queue("ZADD", a.Pending(), r.Deadline, idArg)
		batch.register(wq, s.Keys, w)
		wq.Queue("HINCRBY", a.Stats(r.Queue), StatRunning, 1)
		rec, result = r, Claimed
		if cs != nil {
			cs.runs = r.Runs
		}
	}
	wq.Queue("LREM", a.Inflight(), 1, idArg)
	return rec, result, nil
}

// unserved decides, inside a claim, about a task of a type the worker
// does not serve on queue q: back (true) while a live worker serves the
// type or for grace ms after it was first seen unserved, which it records.
func (s *Store) unserved(tx *txn.Tx, q, typ string, now, grace int64) (bool, error) {
	if err := tx.Send("EXISTS", s.Keys.Served(q, typ)); err != nil {
		return false, err
	}
	if err := tx.Send("HGET", s.Keys.Unserved(q), typ); err != nil {
		return false, err
	}
	reps, err := tx.Flush()
	if err != nil {
		return false, err
	}
	if len(reps) != 2 {
		return false, fmt.Errorf("%d replies to 2 reads", len(reps))
	}
	live, err := redis.Int(reps[0], asError(reps[0]))
	if err != nil {
		return false, err
	}
	if live == 1 {
		return true, nil
	}
	if grace <= 0 {
		return false, nil
	}
	since, err := redis.Int64(reps[1], asError(reps[1]))
	switch {
	case errors.Is(err, redis.ErrNil):
		tx.Queue("HSETNX", s.Keys.Unserved(q), typ, now)
		return true, nil
	case err != nil:
		return false, err
	}
	return now-since < grace, nil
}

// readable decodes a record read for an id taken from a list. A missing
// or undecodable record cannot run: it queues a dead letter saying why
// (with the raw bytes as its payload, under queue q) and returns the error.
func (s *Store) readable(tx queuer, id, q string, raw []byte, now int64) (*Record, error) {
	if raw == nil {
		err := fmt.Errorf("task %s: record missing: %w", id, ErrNotFound)
		s.bury(tx, &Record{ID: id, Queue: q, Type: "?", MaxAttempts: 1}, now, "task record missing")
		return nil, err
	}
	r, err := DecodeRecord(id, raw)
	if err != nil {
		s.bury(tx, &Record{ID: id, Queue: q, Type: "?", MaxAttempts: 1, Payload: raw}, now, err.Error())
		return nil, err
	}
	return r, nil
}

// bury queues the commands that make r a dead letter with reason. A
// record whose queue is not known (an id without a record found in an
// in-flight list, which does not say which ready list it came from) has
// Queue "": it is a dead letter of no queue, counted in no queue's
// gauges, and no queue is invented for it.
func (s *Store) bury(tx queuer, r *Record, now int64, reason string) {
	r.State = StateDead
	r.Finished = now
	r.Worker = ""
	r.LastError = truncate(reason, MaxErrorLen)
	tx.Queue("SET", s.Keys.Task(r.ID), r.Encode())
	tx.Queue("ZADD", s.Keys.Dead(), now, r.ID)
	if r.Queue != "" {
		tx.Queue("HINCRBY", s.Keys.Stats(r.Queue), StatDead, 1)
		tx.Queue("SADD", s.Keys.Queues(), r.Queue)
	}
	s.finalWrites(tx, r)
}

// ReasonExpired starts the reason of a task buried because it was not
// started by its Record.ExpireAt.
const ReasonExpired = "expired"

// ErrWrongType: a task record key that holds another type than a string
// (a list written by hand, say). The key is set aside under bad: and the
// id becomes a dead letter saying so.
var ErrWrongType = errors.New("task record key of the wrong type")

// buryWrongType queues, inside a transaction watching t:<id>, the commands
// that set a record key of the wrong type aside (RENAME t:<id>
// bad:t:<id>) and leave a dead letter in its place saying so, under queue
// q ("" when not known).
func (s *Store) buryWrongType(tx *txn.Tx, id, q string, now int64) error {
	key := s.Keys.Task(id)
	typ, err := redis.String(tx.Do("TYPE", key))
	if err != nil {
		return err
	}
	tx.Queue("RENAME", key, s.Keys.Quarantine(key))
	s.bury(tx, &Record{ID: id, Queue: q, Type: "?", MaxAttempts: 1}, now,
		fmt.Sprintf("%v: t:%s holds a %s; set aside as %s", ErrWrongType, id, typ, s.Keys.Quarantine(key)))
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Outcome is what a finished run leads to.
type Outcome int

// Outcomes of Finish.
const (
	Done  Outcome = iota // succeeded
	Again                // run again at Record.Due (state Retry after a failure, Waiting when asked to)
	Bury                 // to the dead letters with Record.LastError
)

// Finish ends worker w's run number run of task id. decide sees the
// record as it is in Redis and sets what the outcome needs (State, Due,
// Attempts, LastError); doneTTL is how long a done record is kept, in
// seconds (0: deleted at once).
//
//	WATCH   t:<id> (and cw:<id> when a success may leave the completion
//	        list out: skipsCompletion)
//	read    GET t:<id> (must be running under w, run number run); with
//	        the mark MGET t:<id> cw:<id>, and GET t:<id> again when nil
//	queue   ZREM p:<w> id; HINCRBY st running -1; for a run that holds a
//	        slot (Record.HoldsSlot) DECR sl:<q> and a token on sw:<q>
//	        (releaseSlot), the flag cleared; and then
//	Done:   SETEX t:<id> doneTTL record (or DEL); HINCRBY processed +1;
//	        the final writes (unique key, result, completion, reply; the
//	        completion list only with a mark, or when the done record is
//	        kept shorter than the list would be)
//	Again:  SET t:<id>; RPUSH bucket + ZADD sched + wake (or LPUSH
//	        ready + tokens when due); HINCRBY scheduled/retrying/failed
//	        (snoozed, for a snooze)
//	Bury:   SET t:<id>; ZADD dead; HINCRBY dead +1, failed +1; the
//	        final writes (unique key, completion, reply)
//
// decide may set Record.Result on a Done outcome: it is stored for the
// result retention and sent with the reply.
//
// If the record is no longer this run's (the lease ran out and the task
// was recovered, or this very result was recorded by an earlier attempt
// whose reply was lost), nothing is written and ErrLeaseLost is returned
// together with the record as it is, so the caller can tell which. A crash
// before EXEC leaves the task running in p:<w>, recovered by the reaper.
func (s *Store) Finish(ctx context.Context, conn redis.Conn, w, id string, run int, now, doneTTL int64, decide func(*Record) Outcome) (*Record, Outcome, error) {
	key := s.Keys.Task(id)
	var (
		rec *Record
		out Outcome
	)
	watch := []string{key}
	marks := s.skipsCompletion(doneTTL)
	if marks {
		watch = append(watch, s.Keys.Waiter(id))
	}
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		waited := true
		var r *Record
		var err error
		if marks {
			var reps []interface{}
			var marked []bool
			if err = s.sendRecords(tx, []string{id}, true, watch[:1], watch[1:2]); err == nil {
				if reps, err = tx.Flush(); err == nil && len(reps) != 1 {
					err = fmt.Errorf("%d replies to 1 read", len(reps))
				}
			}
			if err == nil {
				reps, marked, err = s.recordReplies(tx, []string{id}, true, reps[0])
			}
			if err != nil {
				return err
			}
			waited = marked[0]
			r, err = recordOf(id, reps[0], asError(reps[0]))
		} else {
			r, err = s.getRecord(tx, id)
		}
		if err != nil {
			return err
		}
		if r.State != StateRunning || r.Worker != w || r.Runs != run {
			rec = r
			return ErrLeaseLost
		}
		if err := s.flowRead(tx, r, FlowViews{}); err != nil {
			return err
		}
		var err2 error
		out, err2 = s.finishWrites(tx, s.workerArgs(w), key, r, now, doneTTL, waited, decide)
		if err2 != nil {
			return err2
		}
		rec = r
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrLeaseLost) {
			rec = nil
		}
		return rec, 0, fmt.Errorf("buckets: finish %s: %w", id, err)
	}
	return rec, out, nil
}

// finishWrites queues Finish's writes for record r as it is in Redis.
//
// waited tells whether somebody waits for the task (a waiter mark read
// under WATCH): a success leaves the completion list out when nobody
// waits and the done record is kept at least as long as the list would be
// (skipsCompletion); Wait then reads the outcome from the record.
func (s *Store) finishWrites(tx queuer, a *workerArgs, key string, r *Record, now, doneTTL int64, waited bool, decide func(*Record) Outcome) (Outcome, error) {
	st := a.Stats(r.Queue)
	tx.Queue("ZREM", a.Pending(), r.ID)
	tx.Queue("HINCRBY", st, StatRunning, -1)
	s.releaseSlot(tx, r, now)
	out := decide(r)
	r.Worker = ""
	r.Deadline = 0
	switch out {
	case Done:
		r.State = StateDone
		r.Finished = now
		if doneTTL > 0 {
			tx.Queue("SETEX", key, doneTTL, r.Encode())
		} else {
			tx.Queue("DEL", key)
		}
		tx.Queue("HINCRBY", st, StatProcessed, 1)
		s.finalWritesFor(tx, r, waited || !s.skipsCompletion(doneTTL))
	case Again:
		if r.State == StateRetry {
			// The retrying gauge counts it while it waits in a bucket
			// (place); due at once, it is ready, not retrying.
			tx.Queue("HINCRBY", st, StatFailed, 1)
		} else {
			// Asked for by the handler (a snooze), not a failure.
			r.State = StateWaiting
			tx.Queue("HINCRBY", st, StatSnoozed, 1)
		}
		tx.Queue("SET", key, r.Encode())
		s.place(tx, r, now, false)
	case Bury:
		tx.Queue("HINCRBY", st, StatFailed, 1)
		s.bury(tx, r, now, r.LastError)
	default:
		return out, fmt.Errorf("buckets: unknown outcome %d", out)
	}
	return out, nil
}

// ErrWatchLost is FinishHeld's answer when the record changed since the
// claim (or the watch was not held): nothing was written, and the caller
// must finish the checked way, with Finish.
var ErrWatchLost = errors.New("buckets: the record changed since the claim")

// FinishHeld is Finish in one round trip, for a run whose Claim held the
// watch on its record (held is ClaimState.Held, and nothing else ran on
// its connection since): the record is the claimed one, r, known without
// reading it, because any change to it since the claim makes EXEC answer
// nil. Then nothing is written and ErrWatchLost is returned. waited is
// what the claim read of the task's waiter mark (ClaimState.Waited), which
// the held watch covers too: a waiter that marks the task since makes
// EXEC answer nil, and Finish then reads the mark. next is sent
// right after EXEC in the same round trip (the next RPOPLPUSH, say); its
// replies are returned, also with ErrWatchLost. The round trip is bounded
// by ctx.
//
// queue   as Finish, built from r.
func (s *Store) FinishHeld(ctx context.Context, held *txn.Held, w string, r *Record, waited bool, now, doneTTL int64, decide func(*Record) Outcome, next []txn.Cmd) (*Record, Outcome, []interface{}, error) {
	if r.FlowReads() {
		return nil, 0, nil, ErrWatchLost // its group must be read: the checked way
	}
	r = r.clone()
	var cmds cmdList
	out, err := s.finishWrites(&cmds, s.workerArgs(w), s.Keys.Task(r.ID), r, now, doneTTL, waited, decide)
	if err != nil {
		return nil, 0, nil, err
	}
	reps, after, err := held.Exec(ctx, cmds, next...)
	switch {
	case errors.Is(err, txn.ErrConflict), errors.Is(err, txn.ErrNotHeld):
		return nil, 0, after, ErrWatchLost
	case err != nil:
		// EXEC ran but a push failed on a key of the wrong type: place
		// the task again once the key is set aside.
		if ok, rerr := s.repairPlacement(ctx, held.Conn(), reps, err); rerr == nil && ok {
			return r, out, after, nil
		}
		return nil, 0, nil, fmt.Errorf("buckets: finish %s: %w", r.ID, err)
	}
	return r, out, after, nil
}

func (r *Record) clone() *Record {
	c := *r
	return &c
}

// place queues the commands that put a waiting task where its due time
// says: its ready list when due (front: at the pop end), else its bucket.
func (s *Store) place(tx queuer, r *Record, now int64, front bool) {
	if r.Due <= now {
		s.pushReady(tx, r.Place(), []string{r.ID}, front)
		return
	}
	ts := BucketTime(r.Due, s.Resolution)
	if r.State == StateRetry {
		s.scheduleRetry(tx, r.Place(), ts, r.ID)
	} else {
		s.scheduleBucket(tx, r.Place(), ts, []string{r.ID})
		tx.Queue("HINCRBY", s.Keys.Stats(r.Queue), StatScheduled, 1)
	}
	s.wakeDispatchers(tx, ts)
}

// getRecord reads and decodes t:<id> inside a transaction.
func (s *Store) getRecord(tx *txn.Tx, id string) (*Record, error) {
	rep, err := tx.Do("GET", s.Keys.Task(id))
	return recordOf(id, rep, err)
}

// recordOf decodes rep, the reply to GET t:<id>.
func recordOf(id string, rep interface{}, err error) (*Record, error) {
	raw, err := redis.Bytes(rep, err)
	if errors.Is(err, redis.ErrNil) {
		return nil, fmt.Errorf("task %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return DecodeRecord(id, raw)
}

// AbandonResult says what Abandon found.
type AbandonResult int

// Abandon outcomes.
const (
	AbandonNone      AbandonResult = iota // the pending entry was gone: someone else handled the run
	AbandonDropped                        // the record was deleted: pending entry and gauge cleared
	AbandonBuried                         // the record was malformed or of the wrong type: also a dead letter now
	AbandonStillOurs                      // the record still shows this run: nothing written
)

// Abandon clears worker w's run number run of the task whose record r was
// claimed, after its result could not be recorded because the record was
// deleted, corrupted or replaced by a key of another type while it ran.
//
// WATCH   t:<id>, p:<w>
// read    GET t:<id> (TYPE when of the wrong type), ZSCORE p:<w> id
// queue   (pending entry present, record not a run of w)
//
//	ZREM p:<w> id; HINCRBY st:<q> running -1; the slot the claim
//	took, if any (releaseSlot: DECR sl:<q>, a token on sw:<q>), and
//	wrong type: RENAME t:<id> bad:t:<id>; dead letter saying so
//	malformed:  dead letter saying so, the bytes as its payload
//	deleted:    nothing more
//
// A crash before EXEC leaves the pending entry, which a reaper drops
// (Requeue) once the lease ends. A record running under w again (a later
// run of the same worker) is left alone.
func (s *Store) Abandon(ctx context.Context, conn redis.Conn, w string, r *Record, now int64) (AbandonResult, error) {
	key, pending := s.Keys.Task(r.ID), s.Keys.Pending(w)
	var out AbandonResult
	_, err := s.runner.Run(ctx, conn, []string{key, pending}, func(tx *txn.Tx) error {
		out = AbandonNone
		if err := tx.Send("GET", key); err != nil {
			return err
		}
		if err := tx.Send("ZSCORE", pending, r.ID); err != nil {
			return err
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		if e := asError(reps[1]); e != nil {
			return e
		}
		if reps[1] == nil {
			return nil
		}
		if e := asError(reps[0]); e != nil && !IsWrongType(e) {
			return e // LOADING, say: try again, judge nothing
		}
		wrongType := IsWrongType(asError(reps[0]))
		raw, _ := reps[0].([]byte)
		var cur *Record
		if !wrongType && raw != nil {
			if c, derr := DecodeRecord(r.ID, raw); derr == nil {
				cur = c
			}
		}
		if cur != nil && cur.State == StateRunning && cur.Worker == w {
			out = AbandonStillOurs
			return nil
		}
		if cur == nil && r.Flow != nil {
			// A workflow's step or member whose record is gone or
			// destroyed: its chain or group learns of it (from the
			// record as claimed), instead of waiting for it for ever.
			if err := s.flowRead(tx, r, FlowViews{}); err != nil {
				return err
			}
		}
		tx.Queue("ZREM", pending, r.ID)
		tx.Queue("HINCRBY", s.Keys.Stats(r.Queue), StatRunning, -1)
		if r.HoldsSlot {
			s.releaseSlot(tx, r.clone(), now) // the slot the claim took
		}
		var reason string
		state := StateDead
		switch {
		case wrongType:
			out = AbandonBuried
			reason = "record replaced by a key of another type while it ran"
			if err := s.buryWrongType(tx, r.ID, r.Queue, now); err != nil {
				return err
			}
		case raw == nil:
			out = AbandonDropped
			reason, state = "record deleted while it ran", StateCancelled
		case cur == nil:
			out = AbandonBuried
			_, derr := DecodeRecord(r.ID, raw)
			reason = fmt.Sprintf("record corrupted while it ran: %v", derr)
			s.bury(tx, &Record{ID: r.ID, Queue: r.Queue, Type: r.Type, MaxAttempts: 1, Payload: raw}, now, reason)
		default:
			// Decodable, not running under w: another's business now.
			out = AbandonNone
			return nil
		}
		if r.Flow != nil {
			ended := r.clone()
			ended.State, ended.Finished, ended.LastError, ended.Worker = state, now, reason, ""
			s.flowWrites(tx, ended)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("buckets: abandon %s: %w", r.ID, err)
	}
	return out, nil
}

// sendRecords sends, inside tx, one read of the records of ids and, with
// marks set, of their waiter marks (Keys.Waiter): MGET t:<id>... [cw:<id>...].
// Its reply, after the caller's Flush, goes to recordReplies. tkeys and
// wkeys, when given, are those keys already built (the transaction's
// WATCH names them too), in the order of ids.
func (s *Store) sendRecords(tx *txn.Tx, ids []string, marks bool, tkeys, wkeys []string) error {
	n := len(ids)
	if marks {
		n *= 2
	}
	keys := make([]interface{}, 0, n)
	for i, id := range ids {
		if tkeys != nil {
			keys = append(keys, tkeys[i])
		} else {
			keys = append(keys, s.Keys.Task(id))
		}
	}
	if marks {
		for i, id := range ids {
			if wkeys != nil {
				keys = append(keys, wkeys[i])
			} else {
				keys = append(keys, s.Keys.Waiter(id))
			}
		}
	}
	return tx.Send("MGET", keys...)
}

// recordReplies splits rep, the reply to sendRecords' MGET, into one
// reply per id as GET t:<id> gives it, and whether each id has a waiter
// mark (all false without marks). MGET answers nil both for a missing key
// and for a key of another type: an id whose record came back nil is read
// again with GET inside tx (its key is watched), which tells them apart, so
// that a key of the wrong type is set aside (buryWrongType) as a GET would
// have found it, never overwritten as a missing record.
func (s *Store) recordReplies(tx *txn.Tx, ids []string, marks bool, rep interface{}) ([]interface{}, []bool, error) {
	all, err := redis.Values(rep, asError(rep))
	if err != nil {
		return nil, nil, err
	}
	want := len(ids)
	if marks {
		want *= 2
	}
	if len(all) != want {
		return nil, nil, fmt.Errorf("MGET answered %d values for %d keys", len(all), want)
	}
	reps := all[:len(ids)]
	waited := make([]bool, len(ids))
	if marks {
		for i, m := range all[len(ids):] {
			waited[i] = m != nil
		}
	}
	var again []int
	for i, r := range reps {
		if r == nil {
			if err := tx.Send("GET", s.Keys.Task(ids[i])); err != nil {
				return nil, nil, err
			}
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return reps, waited, nil
	}
	got, err := tx.Flush()
	if err != nil {
		return nil, nil, err
	}
	if len(got) != len(again) {
		return nil, nil, fmt.Errorf("%d replies to %d reads", len(got), len(again))
	}
	for j, i := range again {
		reps[i] = got[j]
	}
	return reps, waited, nil
}
