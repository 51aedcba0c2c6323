package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// PopMany takes up to n of the oldest ready tasks of queue q into worker
// process w's in-flight list in one round trip: n RPOPLPUSH q:<q> f:<w>
// sent together. Each is atomic on its own, so a task is never only in
// the memory of a process, as with Pop. It returns the ids taken, oldest
// first; fewer than n (or none) when the queue ran out. An error reply
// (a key of the wrong type) is returned with the ids taken before it; a
// connection failure may have lost the replies of pops that happened.
func (s *Store) PopMany(ctx context.Context, conn redis.Conn, q, w string, n int) ([]string, error) {
	if n <= 1 {
		id, err := s.Pop(ctx, conn, q, w)
		if id == "" {
			return nil, err
		}
		return []string{id}, err
	}
	reps, err := pipeline(ctx, conn, s.PopsNext(q, w, n))
	if err != nil {
		return nil, fmt.Errorf("buckets: pop %s: %w", q, err)
	}
	return Popped(q, reps)
}

// PopsNext is n pops of queue q into w's in-flight list (PopNext), to
// pipeline or to send behind a transaction (FinishGroupHeld's next); read
// their replies with Popped.
func (s *Store) PopsNext(q, w string, n int) []txn.Cmd {
	cmds := make([]txn.Cmd, n)
	cmds[0] = s.PopNext(q, w)
	for i := range cmds {
		cmds[i] = cmds[0] // one argument list for all: sending only reads it
	}
	return cmds
}

// Popped reads the replies of pops of queue q (PopNext, sent behind
// another transaction or pipelined) as the ids they took into the
// in-flight list, in order. An error reply is returned after the others
// are read: it stopped nothing on the server, and ids taken by later pops
// are returned with it.
func Popped(q string, reps []interface{}) ([]string, error) {
	var ids []string
	var err error
	for _, rep := range reps {
		if e := asError(rep); e != nil {
			err = fmt.Errorf("buckets: pop %s: %w", q, e)
			continue
		}
		if rep == nil {
			continue // the queue ran out (a push may refill it for a later pop)
		}
		id, serr := redis.String(rep, nil)
		if serr != nil {
			err = fmt.Errorf("buckets: pop %s: %w", q, serr)
			continue
		}
		ids = append(ids, id)
	}
	return ids, err
}

// ClaimBatch is Claim for several ids popped from queue q together, in one
// optimistic transaction: it WATCHes every t:<id> and the paused set,
// reads them in one round trip, decides each id as Claim does and sends
// the concatenation of their writes in one MULTI/EXEC.
//
//	WATCH   t:<id1> … t:<idn> paused f:<w> (and sl:<q> when a ClaimState
//	        says Limited)
//	read    MGET t:<id1> … t:<idn>, SISMEMBER paused q, LRANGE f:<w> 0
//	        n-1 (and GET sl:<q>, HGET lim:<q> max_running when limited;
//	        one round trip; GET t:<id> again for an id MGET answers
//	        nil, which tells a missing record from a key of another type)
//	queue   per id, Claim's writes for what its record says, coalesced
//	        as FinishGroup's; when the ids are the n entries at the head
//	        of f:<w> (nothing pushed there since PopMany took them), one
//	        LTRIM f:<w> n -1 instead of their n LREM f:<w> 1 id; of a
//	        limited queue, as many are claimed as slots are free (one INCR
//	        sl:<q> each), the rest go back (Full) in the one RPUSH
//
// An id popped twice (a duplicate in the ready list) is decided once; its
// second copy is Skipped. A change to any of the records before EXEC makes
// the whole batch read and decide again (txn.Runner.Run). cs has one ClaimState per id, kept
// by the caller across retries of the batch, so that a retry after a lost
// EXEC reply recognises its own claims.
//
// Without hold no watch is left after it: the batch's results are
// recorded with FinishGroup, which reads. With hold the claim also
// watches and reads every id's waiter mark (WATCH cw:<id> too; the MGET
// reads t:<id> and cw:<id>), and the records and marks of the tasks it
// claimed (a workflow member's left out: its finish reads its group) are
// WATCHed again right after EXEC, in the same round trip. That watch is
// left on conn for FinishGroupHeld: each such id's cs[i].Held() is it (one
// Held, shared) and cs[i].Waited() the mark read. The caller must run
// nothing else on conn until the watch is used or released.
//
// Crash points are Claim's: before EXEC every id is still in f:<w>, where
// the worker's recoverer (or, once its heartbeat is gone, the reaper)
// finds it; after EXEC each claimed task is in p:<w> under its lease.
func (s *Store) ClaimBatch(ctx context.Context, conn redis.Conn, w, q string, ids []string, now int64, deadline func(*Record) int64, cs []ClaimState, hold bool) ([]*Record, []ClaimResult, error) {
	if len(cs) != len(ids) {
		return nil, nil, fmt.Errorf("buckets: claim batch: %d claim states for %d ids", len(cs), len(ids))
	}
	inflight := s.Keys.Inflight(w)
	n := len(ids)
	watch := make([]string, 0, 2*n+2)
	for _, id := range ids {
		watch = append(watch, s.Keys.Task(id))
	}
	var wkeys []string // cw:<id>, with hold
	if hold {
		for _, id := range ids {
			watch = append(watch, s.Keys.Waiter(id))
		}
		wkeys = watch[n : 2*n]
	}
	watch = append(watch, s.Keys.Paused(), inflight)
	limited := false
	for i := range cs {
		limited = limited || cs[i].Limits.MaxRunning > 0
	}
	if limited {
		watch = append(watch, s.Keys.Slots(QueueOf(q)))
	}
	recs := make([]*Record, n)
	results := make([]ClaimResult, n)
	var (
		held   *txn.Held
		waited []bool // per id, its mark as read (with hold)
		kept   []int  // the ids whose record and mark held covers
		slots  *flowBudget
	)
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		held, waited, kept = nil, nil, nil
		for i := range ids {
			recs[i], results[i] = nil, Skipped
		}
		if err := s.sendRecords(tx, ids, hold, watch[:n], wkeys); err != nil {
			return err
		}
		if err := tx.Send("SISMEMBER", s.Keys.Paused(), QueueOf(q)); err != nil {
			return err
		}
		if err := tx.Send("LRANGE", inflight, 0, n-1); err != nil {
			return err
		}
		want := 3
		if limited {
			if err := s.sendSlotReads(tx, QueueOf(q)); err != nil {
				return err
			}
			want = 5
		}
		got, err := tx.Flush()
		if err != nil {
			return err
		}
		if len(got) != want {
			return fmt.Errorf("%d replies to %d reads", len(got), want)
		}
		slots = nil
		if limited {
			if slots, err = slotBudgetOf(got[3], got[4]); err != nil {
				return err
			}
		}
		atHead := popHead(got[2], ids)
		paused, err := redis.Int(got[1], nil)
		if err != nil {
			return err
		}
		reps, marked, err := s.recordReplies(tx, ids, hold, got[0])
		if err != nil {
			return err
		}
		batch := &batchState{runs: map[string]string{}}
		args := s.workerArgs(w)
		seen := make(map[string]bool, n)
		// Four writes a claimed task, the registry's SADD and the ids
		// given back: room for all, so that the list is not grown.
		writes := make(cmdList, 0, 4*n+2)
		ct := claimTx{tx: tx, wq: &writes, a: args, q: q, paused: paused == 1, flow: slots, now: now, deadline: deadline, batch: batch}
		for i, id := range ids {
			if seen[id] {
				// The same id twice in the list (a push repeated after a
				// lost reply, say): the claim of the first copy decides;
				// this one is only taken out of the in-flight list, as a
				// claim after it would find the task running.
				writes.Queue("LREM", args.Inflight(), 1, id)
				continue
			}
			seen[id] = true
			recs[i], results[i], err = s.claimDecide(ct, id, watch[i], reps[i], &cs[i])
			if err != nil {
				return err
			}
		}
		batch.flush(&writes, s, q)
		if atHead {
			writes = trimInflight(writes, inflight, n)
		}
		tx.QueueAll(coalesce(writes))
		if hold {
			var keep []string
			for i, r := range recs {
				if results[i] == Claimed && !r.FlowReads() {
					keep = append(keep, watch[i], wkeys[i])
					kept = append(kept, i)
				}
			}
			if len(keep) > 0 {
				held, waited = tx.Hold(keep...), marked
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("buckets: claim batch of %d: %w", n, err)
	}
	for i := range cs {
		cs[i].held, cs[i].waited = nil, false
	}
	for _, i := range kept {
		cs[i].held, cs[i].waited = held, waited[i]
	}
	if slots != nil {
		for i := range cs {
			cs[i].Free = slots.free
		}
	}
	return recs, results, nil
}

// popHead reports whether rep, the reply to LRANGE f:<w> 0 n-1, is ids
// as PopMany left them: the last popped at the head (RPOPLPUSH pushes
// there), so the n entries at the head are exactly the batch's.
func popHead(rep interface{}, ids []string) bool {
	head, err := redis.Strings(rep, asError(rep))
	if err != nil || len(head) != len(ids) {
		return false
	}
	for i, id := range ids {
		if head[len(ids)-1-i] != id {
			return false
		}
	}
	return true
}

// trimInflight replaces, in a batch claim's writes, the n LREM f:<w> 1 id
// (one per id of the batch, whatever its claim decided) with one LTRIM
// f:<w> n -1, for a batch whose ids are the n entries at the head of the
// in-flight list (popHead, read under WATCH f:<w>: EXEC fails if the list
// changed since). Writes with another count of LREMs are returned as
// they are; otherwise the result is built in writes' array.
func trimInflight(writes cmdList, inflight string, n int) cmdList {
	lrems := 0
	for _, c := range writes {
		if c.Name == "LREM" && c.Args[0] == inflight {
			lrems++
		}
	}
	if lrems != n {
		return writes
	}
	out := writes[:0] // in place: each command is read before its slot is written
	for _, c := range writes {
		if c.Name == "LREM" && c.Args[0] == inflight {
			continue
		}
		out = append(out, c)
	}
	out.Queue("LTRIM", inflight, n, -1)
	return out
}

// FinishItem is one run's result for FinishGroup.
type FinishItem struct {
	ID  string
	Run int   // the run number the claim wrote
	Now int64 // when the run ended, ms
	// Decide sees the record as it is in Redis and sets what the outcome
	// needs, as Finish's decide.
	Decide func(*Record) Outcome
	// Watch are further keys to watch for this task (read by Decide's
	// caller before the group, say); the group fails over to a re-read if
	// one changes.
	Watch []string
}

// FinishResult is what FinishGroup did with one item.
type FinishResult struct {
	Rec *Record // the record as written (Err nil), or as read (ErrLeaseLost)
	Out Outcome
	// Err is nil when the result is recorded; ErrLeaseLost when the record
	// is no longer this run's (Rec is as read); otherwise what reading the
	// record met (ErrNotFound, ErrMalformed, a wrong-type reply). Nothing
	// is written for an item with an error: Finish tells the rest.
	Err error
}

// FinishGroup records the results of several of worker w's runs in one
// optimistic transaction: the concatenation of each run's Finish writes,
// built by the same per-task function (finishWrites).
//
//	WATCH   t:<id> for each item (and cw:<id> when a success may leave
//	        the completion list out: skipsCompletion), and each item's
//	        Watch keys
//	read    MGET t:<id>... [cw:<id>...] (each record must be running
//	        under w, its run number; GET t:<id> again for an id MGET
//	        answers nil)
//	queue   per item that is this run's, Finish's writes, coalesced: the
//	        counter increments of one hash summed, the ZREMs of one sorted
//	        set joined (see coalesce)
//
// A change to any watched key before EXEC makes the whole group read and
// decide again. An item whose record is not this run's, or cannot be
// read, gets its error and no write; the others are recorded. A returned
// error means the group as a whole failed: when it is a connection
// failure the EXEC may have run, and each item must be reconciled as a
// lost reply of Finish is. Crash points are Finish's, for every item at
// once: before EXEC every task is still running in p:<w> (the reaper
// returns it when its lease ends), after it every result is recorded.
func (s *Store) FinishGroup(ctx context.Context, conn redis.Conn, w string, items []FinishItem, doneTTL int64) ([]FinishResult, error) {
	marks := s.skipsCompletion(doneTTL)
	watch := make([]string, 0, 2*len(items))
	ids := make([]string, len(items))
	keys := make([]string, len(items)) // each item's t:<id>
	var wkeys []string                 // and cw:<id>, with marks
	if marks {
		wkeys = make([]string, len(items))
	}
	for i, it := range items {
		ids[i] = it.ID
		keys[i] = s.Keys.Task(it.ID)
		watch = append(watch, keys[i])
		if marks {
			wkeys[i] = s.Keys.Waiter(it.ID)
			watch = append(watch, wkeys[i])
		}
		watch = append(watch, it.Watch...)
	}
	res := make([]FinishResult, len(items))
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		for i := range items {
			res[i] = FinishResult{}
		}
		if err := s.sendRecords(tx, ids, marks, keys, wkeys); err != nil {
			return err
		}
		got, err := tx.Flush()
		if err != nil {
			return err
		}
		if len(got) != 1 {
			return fmt.Errorf("%d replies to 1 read", len(got))
		}
		reps, waited, err := s.recordReplies(tx, ids, marks, got[0])
		if err != nil {
			return err
		}
		seen := make(map[string]bool, len(items))
		views := FlowViews{}                     // the groups of workflow members, shared by the items
		writes := make(cmdList, 0, 5*len(items)) // every item's writes, in order
		args := s.workerArgs(w)
		for i, it := range items {
			raw, err := redis.Bytes(reps[i], asError(reps[i]))
			if seen[it.ID] {
				// One run is recorded once: a second result for it is
				// another run's, which the first one's writes end.
				err = ErrLeaseLost
			}
			seen[it.ID] = true
			if errors.Is(err, redis.ErrNil) {
				res[i].Err = fmt.Errorf("task %s: %w", it.ID, ErrNotFound)
				continue
			}
			if err != nil && !errors.Is(err, ErrLeaseLost) {
				res[i].Err = err
				continue
			}
			dup := err != nil
			r, err := DecodeRecord(it.ID, raw)
			if err != nil {
				res[i].Err = err
				continue
			}
			if dup || r.State != StateRunning || r.Worker != w || r.Runs != it.Run {
				res[i] = FinishResult{Rec: r, Err: ErrLeaseLost}
				continue
			}
			// A group member's final transition watches and reads its
			// group (a round trip of its own, for members only).
			if err := s.flowRead(tx, r, views); err != nil {
				return err
			}
			out, err := s.finishWrites(&writes, args, keys[i], r, it.Now, doneTTL, waited[i] || !marks, it.Decide)
			if err != nil {
				return err
			}
			res[i] = FinishResult{Rec: r, Out: out}
		}
		tx.QueueAll(coalesce(writes))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("buckets: finish group of %d: %w", len(items), err)
	}
	return res, nil
}

// HeldItem is one run's result for FinishGroupHeld.
type HeldItem struct {
	Rec    *Record // the record as the claim wrote it (not changed)
	Waited bool    // the claim's read of the waiter mark (ClaimState.Waited)
	Now    int64   // when the run ended, ms
	// Decide sets what the outcome needs on a copy of Rec, as Finish's
	// decide.
	Decide func(*Record) Outcome
}

// FinishGroupHeld is FinishGroup in one round trip, for runs that a
// ClaimBatch with hold claimed together: held is the watch it left (the
// items' ClaimState.Held), and nothing else ran on its connection since.
// Each record is the claimed one, known without reading it, because any
// change to a held record or mark since the claim makes EXEC answer nil;
// then nothing is written and ErrWatchLost is returned, and the caller
// records the results with FinishGroup. The items may be any of the
// batch's held runs: the watch is used up either way, and the others are
// recorded with FinishGroup.
//
//	(held)  WATCH t:<id>... cw:<id>... of the batch's runs, set by the claim
//	queue   per item, Finish's writes for its record, coalesced as
//	        FinishGroup's
//
// next, when given, is sent right behind EXEC in the same round trip (the
// pops of the batch that follows, PopNext), and its replies are returned
// whenever they came, ErrWatchLost included, as FinishHeld's.
//
// A returned error other than ErrWatchLost means the group as a whole
// failed; when it is a connection failure the EXEC may have run, and each
// item must be reconciled as a lost reply of Finish is. Crash points are
// FinishGroup's. The round trip is bounded by ctx.
func (s *Store) FinishGroupHeld(ctx context.Context, held *txn.Held, w string, items []HeldItem, doneTTL int64, next []txn.Cmd) ([]FinishResult, []interface{}, error) {
	args := s.workerArgs(w)
	res := make([]FinishResult, len(items))
	writes := make(cmdList, 0, 5*len(items))
	copies := make([]Record, len(items)) // the items' records are kept for a checked retry
	for i, it := range items {
		if it.Rec.FlowReads() {
			// Its group must be read: the checked way. (ClaimBatch holds
			// no such run.)
			_ = held.Release(ctx)
			return nil, nil, ErrWatchLost
		}
		copies[i] = *it.Rec
		r := &copies[i]
		out, err := s.finishWrites(&writes, args, s.Keys.Task(r.ID), r, it.Now, doneTTL, it.Waited, it.Decide)
		if err != nil {
			_ = held.Release(ctx)
			return nil, nil, fmt.Errorf("buckets: finish group of %d: %w", len(items), err)
		}
		res[i] = FinishResult{Rec: r, Out: out}
	}
	reps, after, err := held.Exec(ctx, coalesce(writes), next...)
	switch {
	case errors.Is(err, txn.ErrConflict), errors.Is(err, txn.ErrNotHeld):
		return nil, after, ErrWatchLost
	case err != nil:
		// EXEC ran but a push failed on a key of the wrong type: place
		// the tasks again once the key is set aside.
		if ok, rerr := s.repairPlacement(ctx, held.Conn(), reps, err); rerr == nil && ok {
			return res, after, nil
		}
		return nil, after, fmt.Errorf("buckets: finish group of %d: %w", len(items), err)
	}
	return res, after, nil
}

// batchState is what the decisions of one ClaimBatch share: the
// skip-if-running periodic entries claimed so far (entry → firing), and
// the ids given back, pushed at the end in one RPUSH so that the oldest
// is again the next to pop. A nil *batchState is Claim's: each id goes
// back at once.
type batchState struct {
	runs       map[string]string
	back       []string
	registered bool // the batch's writes re-add the worker to the registry
}

// register queues SADD w <w> on wq, once per transaction: a claim puts
// ids into p:<w>, and the registry must hold w whenever p:<w> does.
func (b *batchState) register(wq queuer, keys Keys, w string) {
	if b != nil {
		if b.registered {
			return
		}
		b.registered = true
	}
	wq.Queue("SADD", keys.Workers(), w)
}

func (b *batchState) run(entry string) string {
	if b == nil {
		return ""
	}
	return b.runs[entry]
}

func (b *batchState) claimedRun(entry, id string) {
	if b != nil {
		b.runs[entry] = id
	}
}

// giveBack puts id back at the pop end of place q's ready list (and a
// key's place in turn: turnKey).
func (b *batchState) giveBack(tx queuer, s *Store, q, id string) {
	if b == nil {
		tx.Queue("RPUSH", s.Keys.Ready(q), id)
		s.turnKey(tx, q)
		return
	}
	b.back = append(b.back, id)
}

// flush pushes the ids given back to place q's ready list, the oldest
// last (RPOPLPUSH takes from the tail).
func (b *batchState) flush(tx queuer, s *Store, q string) {
	if len(b.back) == 0 {
		return
	}
	args := make([]interface{}, 0, len(b.back)+1)
	args = append(args, s.Keys.Ready(q))
	for i := len(b.back) - 1; i >= 0; i-- {
		args = append(args, b.back[i])
	}
	tx.Queue("RPUSH", args...)
	s.turnKey(tx, q)
}

// coalesce merges, in a transaction's writes, commands that the order of
// the others cannot tell apart from one, into the first of them:
//
//   - HINCRBY of one key and field (summed);
//   - INCR, DECR, INCRBY, DECRBY of one key (one INCRBY of the sum: a
//     claim batch takes a queue's slot per task, a result group gives
//     them back);
//   - ZADD or ZREM of one key (their members joined);
//   - SETs of different keys (one MSET: a claim batch rewrites a record
//     per task);
//   - LPUSHes of one list and its head trims (LTRIM key 0 M, one M): at
//     most a push, a trim and a push (a result group's wake-up tokens);
//     see listRun.next.
//
// A command is merged only when nothing between the two touches its key,
// except other HINCRBYs of the same hash for a HINCRBY (increments
// commute). Everything else keeps its place. TestCoalesceKeepsEffect
// runs random writes both ways on a server and compares every key.
//
// The result is built in cmds' array: the caller must not use cmds
// afterwards. The Args of its commands are never changed.
func coalesce(cmds cmdList) cmdList {
	// out shares cmds' array: it never holds more commands than have been
	// read, and each command is copied out of cmds before its slot can be
	// written.
	out := cmds[:0]
	// marks: per candidate key (the key of a command that may merge,
	// mergeKeyOf), the last command in out that names it as any string
	// argument (a key, in any position) and the last one, not a HINCRBY,
	// whose key it is; open: per merge key, a command later ones of the
	// same kind may join. Only candidate keys are ever looked up, so only
	// they are tracked: a group's writes name many more strings (ids,
	// fields, other keys). A command is kept as given (its Args are not
	// copied): a merge builds new Args for the command it joins, never
	// changing a caller's.
	marks := make(map[string]keyMarks)
	for _, c := range cmds {
		if mk := mergeKeyOf(c); mk.name != "" {
			if key, ok := c.Args[0].(string); ok {
				marks[key] = keyMarks{cand: true, last: -1, other: -1}
			}
		}
	}
	open := make(map[mergeKey]int)
	owned := make([]bool, len(cmds)) // per command of out: its Args were built here
	// sums: per HINCRBY or counter of out that later ones joined, the sum
	// so far, written into its own Args once at the end.
	var sums map[int]int64
	var lists map[string]*listRun // per list key, its run of pushes and trims
	dropped := false              // a command of out was dropped (Name "")
	names := func(j int, args []interface{}) {
		for _, a := range args {
			if s, ok := a.(string); ok {
				if m, found := marks[s]; found {
					m.last = j
					marks[s] = m
				}
			}
		}
	}
	// join appends args to command j, building its own Args first; with
	// mark, the strings among them are noted as named at j.
	join := func(j int, args []interface{}, mark bool) {
		if !owned[j] {
			out[j].Args = append(make([]interface{}, 0, 2*len(out[j].Args)+len(args)), out[j].Args...)
			owned[j] = true
		}
		out[j].Args = append(out[j].Args, args...)
		if mark {
			names(j, args)
		}
	}
	// add appends c to out as a command of its own.
	add := func(c txn.Cmd, key string, mk mergeKey) int {
		j := len(out)
		out = append(out, c)
		names(j, c.Args)
		if m, found := marks[key]; found && m.cand && c.Name != "HINCRBY" {
			m.other = j
			marks[key] = m
		}
		if mk.name != "" {
			open[mk] = j
		}
		return j
	}
	// sum adds n to the sum of command j, which starts at its own value.
	sum := func(j int, n int64) bool {
		a, ok := sums[j]
		if !ok {
			if out[j].Name == "HINCRBY" {
				a, ok = toInt64(out[j].Args[2])
			} else {
				a, ok = delta(out[j])
			}
			if !ok {
				return false
			}
		}
		if sums == nil {
			sums = map[int]int64{}
		}
		sums[j] = a + n
		return true
	}
	for _, c := range cmds {
		key, _ := c.Args[0].(string)
		mk := mergeKeyOf(c)
		switch mk.name {
		case "":
			add(c, key, mk)
			continue
		case "LPUSH":
			if lists == nil {
				lists = map[string]*listRun{}
			}
			r := lists[key]
			if r == nil {
				r = &listRun{pushA: -1, trim: -1, pushB: -1}
				lists[key] = r
			}
			if r.next(c, marks[key].last, out, join, func(c txn.Cmd) int { return add(c, key, mergeKey{}) }) {
				dropped = true
			}
			continue
		case "SET":
			// SETs of distinct keys are an MSET, at the first one's place,
			// when nothing since names this key.
			if j, ok := open[mk]; ok && marks[key].last < j {
				out[j].Name = "MSET"
				join(j, c.Args, true)
				continue
			}
			add(c, key, mk)
			continue
		}
		if j, ok := open[mk]; ok {
			switch {
			case mk.name == "INCRBY" && marks[key].last == j:
				if n, ok := delta(c); ok && sum(j, n) {
					continue
				}
			case c.Name == "HINCRBY" && (marks[key].last == j || marks[key].other < j):
				if n, ok := toInt64(c.Args[2]); ok && sum(j, n) {
					continue
				}
			case c.Name != "HINCRBY" && marks[key].last == j:
				join(j, c.Args[1:], true)
				continue
			}
		}
		add(c, key, mk)
	}
	for j, n := range sums {
		if out[j].Name == "HINCRBY" {
			out[j].Args = []interface{}{out[j].Args[0], out[j].Args[1], n}
		} else {
			out[j] = txn.Cmd{Name: "INCRBY", Args: []interface{}{out[j].Args[0], n}}
		}
	}
	if dropped {
		kept := out[:0]
		for _, c := range out {
			if c.Name != "" {
				kept = append(kept, c)
			}
		}
		out = kept
	}
	return out
}

// listRun is what coalesce keeps of the writes to one list since the
// last command that named it otherwise: the places in out of a push
// (pushA), the head trim after it (trim, LTRIM key 0 m) and a push after
// that (pushB), -1 for none.
type listRun struct {
	pushA, trim, pushB int
	m                  int64
}

// next takes the LPUSH or head trim c of the run's list, last being the
// place in out of the last command that named the list, into the run:
// joined to a push of the run, dropped, or added to out by add. It
// reports whether a command already in out was dropped (Name set to "").
// Each step leaves the list as the commands given would:
//
//	P(a) P(b)         = P(a b)
//	T T               = T                 (a head trim is idempotent)
//	P(a) T P(b) T     = P(a b) T          (b's pushes go before a trim
//	                                       that keeps the same head)
//	T P(b) T          = P(b) T
//
// A trim of another length, or anything else naming the list in between,
// starts a new run.
func (r *listRun) next(c txn.Cmd, last int, out cmdList, join func(int, []interface{}, bool), add func(txn.Cmd) int) (dropped bool) {
	if c.Name == "LPUSH" {
		switch {
		case r.pushB >= 0 && last == r.pushB:
			join(r.pushB, c.Args[1:], true)
		case r.trim >= 0 && r.pushB < 0 && last == r.trim:
			r.pushB = add(c)
		case r.trim < 0 && r.pushA >= 0 && last == r.pushA:
			join(r.pushA, c.Args[1:], true)
		default:
			*r = listRun{pushA: add(c), trim: -1, pushB: -1}
		}
		return false
	}
	m, _ := toInt64(c.Args[2])
	same := r.trim >= 0 && r.m == m
	switch {
	case same && last == r.trim:
		return false
	case same && r.pushB >= 0 && last == r.pushB && r.pushA >= 0:
		// The pushed strings were noted at pushB, after pushA: left so,
		// they only hold back merges, never allow a wrong one.
		join(r.pushA, out[r.pushB].Args[1:], false)
		out[r.pushB].Name = ""
		r.pushB = -1
		return true
	case same && r.pushB >= 0 && last == r.pushB:
		out[r.trim].Name = ""
		r.pushA, r.pushB = r.pushB, -1
		r.trim = add(c)
		return true
	case r.trim < 0 && r.pushA >= 0 && last == r.pushA:
		r.trim, r.m = add(c), m
	default:
		*r = listRun{pushA: -1, trim: add(c), pushB: -1, m: m}
	}
	return false
}

// keyMarks is what coalesce knows of a key: whether a command that may
// merge has it as its key (cand), and the places in its result of the
// last command that names it (last) and of the last one, not a HINCRBY,
// whose key it is (other); -1 for none.
type keyMarks struct {
	cand        bool
	last, other int
}

// mergeKey names what coalesce merges: SETs of any keys (name only), the
// HINCRBYs of one hash and field, the counter changes of one key
// ("INCRBY"), the ZADDs or ZREMs of one key, the pushes and head trims of
// one list ("LPUSH").
type mergeKey struct{ name, key, field string }

// mergeKeyOf is c's merge key; the zero mergeKey when c never merges.
func mergeKeyOf(c txn.Cmd) mergeKey {
	if len(c.Args) == 0 {
		return mergeKey{}
	}
	key, _ := c.Args[0].(string)
	if key == "" {
		return mergeKey{}
	}
	switch c.Name {
	case "SET":
		if len(c.Args) == 2 {
			return mergeKey{name: c.Name}
		}
	case "HINCRBY":
		if len(c.Args) != 3 {
			break
		}
		if _, ok := toInt64(c.Args[2]); ok {
			field, ok := c.Args[1].(string)
			if !ok {
				field = fmt.Sprint(c.Args[1])
			}
			return mergeKey{c.Name, key, field}
		}
	case "INCR", "DECR", "INCRBY", "DECRBY":
		if _, ok := delta(c); ok {
			return mergeKey{name: "INCRBY", key: key}
		}
	case "ZADD", "ZREM":
		return mergeKey{name: c.Name, key: key}
	case "LPUSH":
		if len(c.Args) >= 2 {
			return mergeKey{name: "LPUSH", key: key}
		}
	case "LTRIM":
		if len(c.Args) == 3 {
			start, ok1 := toInt64(c.Args[1])
			m, ok2 := toInt64(c.Args[2])
			if ok1 && ok2 && start == 0 && m >= 0 {
				return mergeKey{name: "LPUSH", key: key}
			}
		}
	}
	return mergeKey{}
}

// delta is the change a counter command makes to its key's value.
func delta(c txn.Cmd) (int64, bool) {
	switch {
	case c.Name == "INCR" && len(c.Args) == 1:
		return 1, true
	case c.Name == "DECR" && len(c.Args) == 1:
		return -1, true
	case c.Name == "INCRBY" && len(c.Args) == 2:
		return toInt64(c.Args[1])
	case c.Name == "DECRBY" && len(c.Args) == 2:
		n, ok := toInt64(c.Args[1])
		return -n, ok
	}
	return 0, false
}

func toInt64(v interface{}) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}
