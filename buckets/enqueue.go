package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Enqueue writes tasks, all or none, in one MULTI/EXEC. now (Unix ms, the
// producer's clock) decides which tasks go straight to their ready list
// (Due <= now) and which wait in the bucket of their due time rounded up
// to the resolution.
//
// chosen lists the ids among recs that the caller chose (the others are
// freshly generated). When there are none, Enqueue reads nothing and watches
// nothing: one round trip. Otherwise the check that they are free and the
// write are one optimistic transaction:
//
//	WATCH      t:<id> ...                     every chosen id
//	read       EXISTS t:<id> ... (pipelined)  any found: UNWATCH, *ExistsError
//
// then, for every task (the same writes as without chosen ids):
//
//	MSET       t:<id> <record> ...            every record (SET for one)
//	SADD       queues <q> ...                 every queue named, but those
//	                                          this Store added in the last
//	                                          10 s (the set only grows)
//	LPUSH      q:<q> <id> ...                 due tasks, per queue, in order
//	LPUSH/LTRIM n:<q> tokens                  wake idle workers of that queue
//	RPUSH      b:<q>:<ts> <id> ...            scheduled tasks, per bucket
//	ZADD       sched <ts> <q>:<ts> ...        index the buckets, all in one
//	HINCRBY    st:<q> scheduled <n>           per queue
//	LPUSH/LTRIM wake <earliest ts>            wake a sleeping dispatcher, when
//	                                          the earliest new bucket is at
//	                                          most WakeHorizon ahead
//
// A record created between the read and EXEC (another producer with the
// same id) makes EXEC answer nil and the transaction runs again, now
// finding the id. A crash before EXEC leaves nothing; after EXEC,
// everything. If the connection fails after EXEC was sent the caller
// cannot know which, and gets an error wrapping ErrUncertain: retrying
// with the same chosen ids then writes the tasks or finds them, exactly
// once; retrying with fresh ids may enqueue them twice, never zero times.
func (s *Store) Enqueue(ctx context.Context, conn redis.Conn, now int64, recs []*Record, chosen ...string) error {
	if len(recs) == 0 {
		return nil
	}
	var (
		cmds  cmdList
		added []string // queues this transaction adds to the set of queues
	)
	if len(recs) == 1 {
		cmds, added = s.enqueueOne(now, recs[0])
	} else {
		cmds, added = s.enqueueMany(now, recs)
	}
	var watch []string
	var flowOf []string // per chosen id, the workflow whose step id it is, or ""
	if len(chosen) > 0 {
		watch = make([]string, 0, len(chosen))
		for _, id := range chosen {
			watch = append(watch, s.Keys.Task(id))
		}
		// A chosen id of a step's form ("<flow>~<i>") is refused while
		// that workflow exists: its steps are written by the workflow
		// itself, over whatever holds the id.
		for i, id := range chosen {
			if f, ok := FlowOfStepID(id); ok {
				if flowOf == nil {
					flowOf = make([]string, len(chosen))
				}
				flowOf[i] = f
				watch = append(watch, s.Keys.Workflow(f))
			}
		}
	}
	ukeys, urecs, err := s.uniqueKeys(recs)
	if err != nil {
		return err
	}
	// sent: the last attempt queued the writes, so MULTI/EXEC was (or was
	// about to be) sent when an error came.
	sent := false
	all := watch
	if len(ukeys) > 0 {
		all = append(watch[:len(watch):len(watch)], ukeys...)
	}
	s.placeKept(ctx, conn)
	reps, err := s.runner.Run(ctx, conn, all, func(tx *txn.Tx) error {
		sent = false
		if err := s.checkFree(tx, chosen, flowOf, watch); err != nil {
			return err
		}
		if err := s.checkUnique(tx, ukeys, urecs); err != nil {
			return err
		}
		for _, c := range cmds {
			tx.Queue(c.Name, c.Args...)
		}
		s.takeUnique(tx, ukeys, urecs)
		sent = true
		return nil
	})
	if err == nil {
		for _, q := range added {
			s.knowQueue(q, now)
		}
		return nil
	}
	return s.enqueueFailed(ctx, conn, cmds, reps, len(recs), sent, err)
}

// enqueueFailed is Enqueue's answer to a transaction that returned err
// (kept out of Enqueue so that the error targets below cost nothing when
// it succeeds): the repair of writes that failed on keys of the wrong
// type, refusals as they are, ErrUncertain when the write was sent and
// its reply lost.
func (s *Store) enqueueFailed(ctx context.Context, conn redis.Conn, cmds cmdList, reps []interface{}, n int, sent bool, err error) error {
	var ee *txn.ExecError
	if errors.As(err, &ee) && !ee.Queued && len(reps) >= len(cmds) {
		// EXEC ran, and some commands failed on keys of the wrong type:
		// the records are written, so place what did not get placed.
		return s.repairEnqueue(ctx, conn, cmds, reps[:len(cmds)])
	}
	var ex *ExistsError
	var dup *DuplicateError
	var rsv *ReservedError
	var reply redis.Error
	switch {
	case errors.As(err, &ex), errors.As(err, &dup), errors.As(err, &rsv):
		return err
	case sent && !errors.Is(err, txn.ErrConflict) && !errors.Is(err, txn.ErrNotRun) && !errors.As(err, &reply):
		// Neither a conflict nor the server's answer: the reply was lost.
		return fmt.Errorf("%d tasks: %w: %w", n, ErrUncertain, err)
	}
	return fmt.Errorf("%d tasks: %w", n, err)
}

// enqueueOne builds Enqueue's writes for one record: SET, SADD when the
// queue is not known, then LPUSH q + tokens or RPUSH b and ZADD (only ZADD
// of its inline entry, see Store.inline), HINCRBY and (maybe) the
// dispatchers' wake. It returns them and the queue it adds.
func (s *Store) enqueueOne(now int64, r *Record) (cmds cmdList, added []string) {
	cmds = make(cmdList, 0, 8)
	cmds.Queue("SET", s.Keys.Task(r.ID), r.Encode())
	if !s.queueKnown(r.Queue, now) {
		cmds.Queue("SADD", s.Keys.Queues(), r.Queue)
		added = []string{r.Queue}
	}
	ids := []string{r.ID}
	if r.Due <= now {
		s.pushReady(&cmds, r.Place(), ids, false)
		return cmds, added
	}
	ts := BucketTime(r.Due, s.Resolution)
	if s.inline(r.Place(), ts, r.ID) {
		cmds.Queue("ZADD", s.Keys.Schedule(), ts, InlineMember(r.Place(), r.ID))
		s.nameLevel(&cmds, r.Place())
	} else {
		s.scheduleBucket(&cmds, r.Place(), ts, ids)
	}
	cmds.Queue("HINCRBY", s.Keys.Stats(r.Queue), StatScheduled, 1)
	s.wakeFor(&cmds, now, ts)
	return cmds, added
}

// enqueueSplit is a set of records as an enqueue writes them: the MSET
// arguments, their queues, the ids due now by queue, and the others by
// queue and bucket time.
type enqueueSplit struct {
	mset     []interface{}
	queues   map[string]bool
	ready    map[string][]string
	readyQs  []string // the queues of ready, in the order they first appear
	sched    map[string]map[int64][]string
	earliest int64 // the earliest bucket time; -1 when none
}

// splitEnqueue sorts recs for an enqueue at now: a record due by now
// (Due <= now) goes to its ready list, the others to their buckets.
func (s *Store) splitEnqueue(now int64, recs []*Record) enqueueSplit {
	sp := enqueueSplit{mset: make([]interface{}, 0, 2*len(recs)), queues: map[string]bool{},
		ready: map[string][]string{}, sched: map[string]map[int64][]string{}, earliest: -1}
	for _, r := range recs {
		sp.mset = append(sp.mset, s.Keys.Task(r.ID), r.Encode())
		sp.queues[r.Queue] = true
		pl := r.Place()
		if r.Due <= now {
			if len(sp.ready[pl]) == 0 {
				sp.readyQs = append(sp.readyQs, pl)
			}
			sp.ready[pl] = append(sp.ready[pl], r.ID)
			continue
		}
		ts := BucketTime(r.Due, s.Resolution)
		if sp.sched[pl] == nil {
			sp.sched[pl] = map[int64][]string{}
		}
		sp.sched[pl][ts] = append(sp.sched[pl][ts], r.ID)
		if sp.earliest < 0 || ts < sp.earliest {
			sp.earliest = ts
		}
	}
	return sp
}

// enqueueMany builds Enqueue's writes for several records (see Enqueue):
// one MSET, one SADD, per queue its ready push, per bucket in time order
// its push and index entry, per queue its counter, one wake.
func (s *Store) enqueueMany(now int64, recs []*Record) (cmds cmdList, added []string) {
	sp := s.splitEnqueue(now, recs)
	if len(sp.mset) == 2 {
		cmds.Queue("SET", sp.mset...)
	} else {
		cmds.Queue("MSET", sp.mset...)
	}
	sadd := []interface{}{s.Keys.Queues()}
	for _, q := range sortedKeys(sp.queues) {
		if !s.queueKnown(q, now) {
			sadd = append(sadd, q)
			added = append(added, q)
		}
	}
	if len(sadd) > 1 {
		cmds.Queue("SADD", sadd...)
	}
	for _, q := range sp.readyQs {
		s.pushReady(&cmds, q, sp.ready[q], false)
	}
	s.scheduleBuckets(&cmds, sp.sched)
	if sp.earliest >= 0 {
		s.wakeFor(&cmds, now, sp.earliest)
	}
	return cmds, added
}

// WakeHorizon is how far ahead (ms) of the producer's clock a new bucket
// may be and still need a token on the dispatchers' wake list. A bucket
// further ahead is left to the dispatchers' own reads of the index: each
// reads it again at least every IndexRecheck while it runs (its idle
// timeout, or its timer, whichever is sooner), so every live dispatcher
// has read the index, found the bucket and set its timer by it well
// before it is due, with a token or without. The margin
// (WakeHorizon - IndexRecheck) covers a round that takes long and clocks
// of producers and dispatchers that differ by up to several minutes.
const WakeHorizon = 10 * 60_000

// IndexRecheck is the longest a dispatcher sleeps between two reads of
// the bucket index, whatever its idle wait (see WakeHorizon).
const IndexRecheck = 60 * time.Second

// wakeFor queues the dispatchers' wake for a new bucket at ts, the
// earliest one a transaction adds, unless ts is more than WakeHorizon
// ahead of now.
func (s *Store) wakeFor(tx queuer, now, ts int64) {
	if ts-now <= WakeHorizon {
		s.wakeDispatchers(tx, ts)
	}
}

// checkFree reads whether the chosen ids (keys their t:<id> keys, then
// wf:<flow> for each non-empty flowOf[i]: the workflow whose step id ids[i]
// would be) have records, and returns a *ReservedError for an id whose
// workflow exists, else an *ExistsError naming those that have records.
func (s *Store) checkFree(tx *txn.Tx, ids, flowOf, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		if err := tx.Send("EXISTS", k); err != nil {
			return err
		}
	}
	reps, err := tx.Flush()
	if err != nil {
		return err
	}
	ns := make([]int, len(reps))
	for i, rep := range reps {
		if ns[i], err = redis.Int(rep, nil); err != nil {
			return fmt.Errorf("EXISTS %s: %w", keys[i], err)
		}
	}
	// The keys past the ids' are the workflows of flowOf, in its order.
	k := len(ids)
	for j, f := range flowOf {
		if f == "" {
			continue
		}
		if ns[k] == 1 {
			return &ReservedError{ID: ids[j], Flow: f}
		}
		k++
	}
	var taken []string
	for i := range ids {
		if ns[i] == 1 {
			taken = append(taken, ids[i])
		}
	}
	if len(taken) > 0 {
		return &ExistsError{IDs: taken}
	}
	return nil
}

// typeFor is the key type each of Enqueue's commands needs.
var typeFor = map[string]string{
	"LPUSH": "list", "RPUSH": "list", "LTRIM": "list", "ZADD": "zset", "SADD": "set", "HINCRBY": "hash", "HDEL": "hash", "MSET": "string",
}

// ErrSetAside is wrapped by an error of Enqueue that says keys of the
// wrong type were renamed out of the way; the tasks were written all the
// same, and the caller should log the error, not retry.
var ErrSetAside = errors.New("keys of the wrong type set aside")

// repairEnqueue completes an Enqueue whose EXEC ran but where commands
// failed on keys of the wrong type (2.4 runs the rest: there is no
// rollback), as repairPlacement completes the other placing transactions
// and with its fix: it sets the bad keys aside and, in one more
// MULTI/EXEC, runs again the failed commands that place tasks (ready list,
// bucket, index); the failed counter and wake-up writes are not worth a
// retry. The fix is tried on fresh connections when the caller's fails,
// and kept for the Store's next placing transaction (PlaceAgain) when
// every try fails: the tasks' records are written, and in no list until
// it runs. It returns an error wrapping ErrSetAside when all is placed,
// another error if not.
func (s *Store) repairEnqueue(ctx context.Context, conn redis.Conn, cmds cmdList, reps []interface{}) error {
	var (
		fix   placementFix
		wrong []string
	)
	for i, rep := range reps {
		if _, ok := rep.(redis.Error); !ok {
			continue
		}
		// Only a key of the wrong type for its command is set aside; a
		// command that failed for another reason (out of memory) fails
		// again in the fix, and Enqueue reports it.
		c := cmds[i]
		key, _ := c.Args[0].(string)
		fix.aside = append(fix.aside, wrongKey{typeFor[c.Name], key})
		wrong = append(wrong, key)
		if s.placement(c) {
			fix.retry = append(fix.retry, c)
		}
	}
	if err := s.applyFixTries(ctx, conn, fix); err != nil {
		if len(fix.retry) > 0 {
			s.keepUnplaced(fix)
			return fmt.Errorf("enqueue: repairing after writes failed on %v: %w (kept: placed again by the next try)", wrong, err)
		}
		return fmt.Errorf("enqueue: repairing after writes failed on %v: %w", wrong, err)
	}
	return fmt.Errorf("enqueue: %v: %w", wrong, ErrSetAside)
}

// exec runs commands in one MULTI/EXEC without WATCH.
func (s *Store) exec(ctx context.Context, conn redis.Conn, cmds cmdList) ([]interface{}, error) {
	return s.runner.Run(ctx, conn, nil, func(tx *txn.Tx) error {
		for _, c := range cmds {
			tx.Queue(c.Name, c.Args...)
		}
		return nil
	})
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// queueKnownFor is how long (ms) after this Store added a queue to the
// set of queues its enqueues leave the SADD out. The set only grows, so
// the SADD is redundant then; the interval bounds how long a set deleted
// by hand (or set aside) misses a queue this Store enqueues to.
const queueKnownFor = 10_000

// queueKnown reports whether this Store added q to the set of queues
// less than queueKnownFor ago (now is Unix ms).
func (s *Store) queueKnown(q string, now int64) bool {
	v, ok := s.known.Load(q)
	return ok && now-v.(int64) < queueKnownFor && now >= v.(int64)
}

// knowQueue records that a committed transaction added q to the set.
func (s *Store) knowQueue(q string, now int64) { s.known.Store(q, now) }
