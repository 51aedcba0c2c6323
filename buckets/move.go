package buckets

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// DueBuckets returns up to limit index members whose bucket time is at or
// before now (Unix ms, the dispatcher's clock), earliest first:
// ZRANGEBYSCORE sched -inf now LIMIT 0 limit. It reads outside any
// transaction: moves watch the buckets themselves.
func (s *Store) DueBuckets(ctx context.Context, conn redis.Conn, now int64, limit int) ([]string, error) {
	return s.dueBuckets(ctx, conn, now, 0, limit)
}

func (s *Store) dueBuckets(ctx context.Context, conn redis.Conn, now int64, offset, limit int) ([]string, error) {
	ms, _, err := s.dueMembers(ctx, conn, now, offset, limit)
	return ms, err
}

// dueMembers is dueBuckets that also returns each member as the reply
// gave it, a bulk string already boxed, for use as a command argument.
func (s *Store) dueMembers(ctx context.Context, conn redis.Conn, now int64, offset, limit int) ([]string, []interface{}, error) {
	raw, err := redis.Values(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Schedule(), "-inf", now, "LIMIT", offset, limit))
	if err == nil && !allBulk(raw) {
		err = errNotBulk
	}
	if err != nil {
		return nil, nil, fmt.Errorf("buckets: due buckets: %w", err)
	}
	ms := make([]string, len(raw))
	for i, v := range raw {
		ms[i] = string(v.([]byte))
	}
	return ms, raw, nil
}

// NextDue returns the earliest bucket time in the index (ZRANGE sched 0 0
// WITHSCORES), and false when the index is empty.
func (s *Store) NextDue(ctx context.Context, conn redis.Conn) (int64, bool, error) {
	rep, err := redis.Values(do(ctx, conn, "ZRANGE", s.Keys.Schedule(), 0, 0, "WITHSCORES"))
	if err != nil {
		return 0, false, fmt.Errorf("buckets: next due: %w", err)
	}
	if len(rep) < 2 {
		return 0, false, nil
	}
	f, err := redis.Float64(rep[1], nil)
	if err != nil {
		return 0, false, fmt.Errorf("buckets: next due score: %w", err)
	}
	return int64(f), true, nil
}

// MoveResult says what moving did.
type MoveResult struct {
	Tasks     int  // task ids made ready
	Buckets   int  // buckets emptied and removed from the index
	Partial   bool // a bucket was larger than its share and was moved in part
	Stale     int  // index members whose bucket was missing or empty, removed
	Conflicts int  // transactions that found a bucket changed, left for later
	// Window is the lookahead window of due buckets MoveDue read (the
	// one asked for, or 0 when that one was empty), and WindowFull
	// whether it held a whole lookahead (more windows may follow).
	Window     int
	WindowFull bool
	// Gated says MoveDue's gate refused to move the full window it read:
	// nothing was moved.
	Gated       bool
	Quarantined []string // keys of the wrong type renamed under bad:
	Garbage     []string // index members that do not parse, removed
	WrongType   []string // ready lists of the wrong type: their buckets wait; set them aside
	// Uncertain are the moves whose EXEC may have run unseen: the
	// connection failed after it was sent. Their push into a ready list
	// may have failed (a key of the wrong type) while their buckets were
	// removed; SettleMove, on another connection, finds out and places
	// their tasks again if need be.
	Uncertain []UncertainMove
}

// UncertainMove is the plan of a move transaction whose outcome was not
// seen: what it took from each bucket and where it pushed it.
type UncertainMove struct {
	Buckets []MovedBucket
}

// MovedBucket is what a move took from one bucket: IDs, from the bucket's
// front, pushed to queue Queue's ready list; the bucket Key is then
// removed (with its index Member) or trimmed by len(IDs).
type MovedBucket struct {
	Queue, Key, Member string
	IDs                []string
	// Inline says Member is the inline entry (InlineMember) of the one
	// task in IDs, and Key that entry's guard (Keys.Guard): there is no
	// bucket list.
	Inline bool
	// raw are the ids as the bucket's read gave them; a move spells them
	// out in IDs only if its outcome is uncertain (spell).
	raw []interface{}
}

// spell fills each bucket's IDs from what its read gave.
func (u *UncertainMove) spell() {
	for i := range u.Buckets {
		b := &u.Buckets[i]
		if b.IDs == nil {
			b.IDs, _ = redis.Strings(b.raw, nil)
		}
	}
}

func (r *MoveResult) add(o MoveResult) {
	r.Tasks += o.Tasks
	r.Buckets += o.Buckets
	r.Partial = r.Partial || o.Partial
	r.Stale += o.Stale
	r.Conflicts += o.Conflicts
	r.Quarantined = append(r.Quarantined, o.Quarantined...)
	r.Garbage = append(r.Garbage, o.Garbage...)
	r.WrongType = append(r.WrongType, o.WrongType...)
	r.Uncertain = append(r.Uncertain, o.Uncertain...)
}

// movePlan is one move transaction: the buckets it watches and reads.
type movePlan struct {
	buckets []moveBucket
	queues  []string      // distinct queues, in first-seen order
	badMems []interface{} // members that do not parse
	share   int           // ids read per bucket at most
	lists   int           // of buckets, how many are lists (not inline entries)
	guards  []int         // the distinct guards of the inline entries
	gkeys   []string      // their keys (Keys.Guard), in the same order
}

// moveBucket is one index member of a plan: a bucket list, or an inline
// entry (id set), which is one task and has no key: its key is its guard.
type moveBucket struct {
	member, q, key string
	id             string // an inline entry's task; empty for a bucket list
	guard          int    // an inline entry's guard (GuardOf id)
	// keyArg and memberArg are key and member as command arguments,
	// boxed once for the several commands that name them.
	keyArg, memberArg interface{}
}

// plan reads members into a move plan. distinct says the members are
// known to be distinct (one read of the index gave them): the plan then
// skips looking for repeats, which cost more than the rest of plan.
// boxed, when not nil, holds the same members as command arguments (as
// the index's reply gave them), so that the plan need not box them again.
func (s *Store) plan(members []string, boxed []interface{}, maxTasks int, distinct bool) *movePlan {
	p := &movePlan{buckets: make([]moveBucket, 0, len(members))}
	var seen map[string]bool
	if !distinct {
		seen = make(map[string]bool, len(members))
	}
	seenQ := map[string]bool{}
	var guardSeen uint32    // bit g: guard g is in p.guards
	var gkey [Guards]string // the key of each guard in p.guards
	for i, m := range members {
		if seen != nil {
			if seen[m] {
				continue
			}
			seen[m] = true
		}
		q, ts, id, err := ParseIndexMember(m)
		if err != nil {
			p.badMems = append(p.badMems, m)
			continue
		}
		var memberArg interface{}
		if boxed != nil {
			memberArg = boxed[i]
		} else {
			memberArg = m
		}
		if id != "" {
			g := GuardOf(id)
			if guardSeen&(1<<g) == 0 {
				guardSeen |= 1 << g
				gkey[g] = s.Keys.Guard(g)
				p.guards = append(p.guards, g)
				p.gkeys = append(p.gkeys, gkey[g])
			}
			p.buckets = append(p.buckets, moveBucket{member: m, q: q, key: gkey[g], id: id, guard: g, memberArg: memberArg})
		} else {
			key := s.Keys.bucketOf(m, q, ts)
			p.buckets = append(p.buckets, moveBucket{member: m, q: q, key: key, keyArg: key, memberArg: memberArg})
			p.lists++
		}
		if !seenQ[q] {
			seenQ[q] = true
			p.queues = append(p.queues, q)
		}
	}
	p.share = max(1, maxTasks/max(1, len(p.buckets)))
	return p
}

// watch is what the plan watches: its bucket lists, then the guards of
// its inline entries.
func (p *movePlan) watch() []string {
	keys := make([]string, 0, p.lists+len(p.gkeys))
	for _, b := range p.buckets {
		if b.id == "" {
			keys = append(keys, b.key)
		}
	}
	return append(keys, p.gkeys...)
}

// watchArgs is watch as command arguments, the bucket keys boxed once by
// plan.
func (p *movePlan) watchArgs() []interface{} {
	args := make([]interface{}, 0, p.lists+len(p.gkeys))
	for _, b := range p.buckets {
		if b.id == "" {
			args = append(args, b.keyArg)
		}
	}
	for _, k := range p.gkeys {
		args = append(args, k)
	}
	return args
}

// sendReads queues the plan's reads without flushing: per member, LRANGE b
// 0 share for a bucket (one more than the share, to learn whether the
// bucket is larger) or ZSCORE sched member for an inline entry (is it
// still there, now that its guard is watched); TYPE q:<q> per queue; and
// HMGET rc of the bucket lists' members (how many of each bucket's first
// entries are retries; an inline entry is never a retry).
func (s *Store) sendReads(send func(string, ...interface{}) error, p *movePlan) error {
	// The reads' arguments share one array: a plan reads many buckets.
	flat := make([]interface{}, 3*len(p.buckets))
	share := interface{}(p.share)
	sched := interface{}(s.Keys.Schedule())
	for i, b := range p.buckets {
		if b.id != "" {
			args := flat[3*i : 3*i+2 : 3*i+2]
			args[0], args[1] = sched, b.memberArg
			if err := send("ZSCORE", args...); err != nil {
				return err
			}
			continue
		}
		args := flat[3*i : 3*i+3 : 3*i+3]
		args[0], args[1], args[2] = b.keyArg, 0, share
		if err := send("LRANGE", args...); err != nil {
			return err
		}
	}
	for _, q := range p.queues {
		if err := send("TYPE", s.Keys.Ready(q)); err != nil {
			return err
		}
	}
	if p.lists == 0 {
		return nil
	}
	args := make([]interface{}, 0, p.lists+1)
	args = append(args, s.Keys.RetryCounts())
	for _, b := range p.buckets {
		if b.id == "" {
			args = append(args, b.memberArg)
		}
	}
	return send("HMGET", args...)
}

// errNotBulk: a list read's reply held something other than bulk strings,
// which no list holds.
var errNotBulk = errors.New("buckets: a list element that is not a bulk string")

// allBulk reports whether every element of a reply array is a bulk string.
func allBulk(vs []interface{}) bool {
	for _, v := range vs {
		if _, ok := v.([]byte); !ok {
			return false
		}
	}
	return true
}

// retryCounts decodes the HMGET rc reply of sendReads: one count per
// bucket, 0 where absent, negative or unreadable, and whether the field
// exists at all (so that a bucket taken whole removes it).
func retryCounts(rep interface{}, n int) ([]int, []bool) {
	out := make([]int, n)
	has := make([]bool, n)
	vals, _ := redis.Values(rep, nil)
	for i := 0; i < n && i < len(vals); i++ {
		has[i] = vals[i] != nil
		if c, err := redis.Int(vals[i], nil); err == nil && c > 0 {
			out[i] = c
		}
	}
	return out, has
}

// build decides the writes of a move from its reads.
//
//	per queue: LPUSH q:<q> ids... (bucket order kept) + LPUSH/LTRIM n:<q>,
//	           HINCRBY st:<q> scheduled -(n-r), retrying -r (r of the n
//	           ids are retries: per bucket, min(taken, its retry count))
//	DEL b ...; ZREM sched member ...      (buckets taken whole, stale members)
//	HDEL rc member ...                    (the same, where counted)
//	ZREM sched entry ...; INCR g:<k> ...  (inline entries still there, their guards)
//	LTRIM b n -1; HINCRBY rc member -r    (a bucket larger than its share)
//	RENAME b bad:b                        (a bucket of the wrong type)
//	a ready list of the wrong type: its buckets are left, see WrongType
//
// moved, when not nil, is told what is taken from each bucket.
func (s *Store) build(tx queuer, p *movePlan, reps []interface{}, moved *UncertainMove) MoveResult {
	b := s.newMoveBuild(tx, p, reps, moved)
	b.setAsideWrongTypeQueues()
	c := 0 // the index in counts of each bucket list, in plan order
	for i, bk := range p.buckets {
		if bk.id != "" {
			b.takeInline(i, bk)
			continue
		}
		b.takeList(i, c, bk)
		c++
	}
	b.pushReady()
	b.dropTaken()
	return b.res
}

// moveBuild is what build gathers from a move's replies, step by step,
// before it queues the writes that depend on all of them.
type moveBuild struct {
	s     *Store
	tx    queuer
	p     *movePlan
	reps  []interface{}
	moved *UncertainMove
	res   MoveResult

	badQ map[string]bool // queues whose ready list has the wrong type
	// ready holds per queue its ready list's push: the list, then the
	// ids as the buckets' reads gave them; retries how many of them were
	// retries.
	ready   map[string][]interface{}
	retries map[string]int
	// counts and counted are each bucket list's retry count (rc).
	counts  []int
	counted []bool
	// The arguments of the DEL, ZREM and HDEL that drop what is taken
	// whole (the key or member first).
	del, zrem, hdel []interface{}
	touched         uint32 // bit g: an inline entry of guard g is removed
}

func (s *Store) newMoveBuild(tx queuer, p *movePlan, reps []interface{}, moved *UncertainMove) *moveBuild {
	nb := len(p.buckets)
	b := &moveBuild{s: s, tx: tx, p: p, reps: reps, moved: moved, res: MoveResult{Stale: len(p.badMems)},
		badQ: map[string]bool{}, ready: map[string][]interface{}{}, retries: map[string]int{},
		del:  make([]interface{}, 0, nb),
		zrem: append(append(make([]interface{}, 0, 1+len(p.badMems)+nb), s.Keys.Schedule()), p.badMems...),
		hdel: append(make([]interface{}, 0, 1+nb), s.Keys.RetryCounts()),
	}
	for _, m := range p.badMems {
		ms, _ := m.(string)
		b.res.Garbage = append(b.res.Garbage, ms)
	}
	if p.lists > 0 {
		b.counts, b.counted = retryCounts(reps[nb+len(p.queues)], p.lists)
	}
	if moved != nil && moved.Buckets == nil {
		moved.Buckets = make([]MovedBucket, 0, nb)
	}
	return b
}

// setAsideWrongTypeQueues leaves the buckets of a queue whose ready list
// has the wrong type where they are. The ready list is not watched, so
// it cannot be renamed here safely (it may be a new list with tasks by
// EXEC): the caller sets it aside (SetAside, which watches it) before
// the next round.
func (b *moveBuild) setAsideWrongTypeQueues() {
	nb := len(b.p.buckets)
	for i, q := range b.p.queues {
		if t, _ := redis.String(b.reps[nb+i], nil); t != "list" && t != "none" {
			b.badQ[q] = true
			b.res.WrongType = append(b.res.WrongType, b.s.Keys.Ready(q))
			b.res.Partial = true
		}
	}
}

// push adds ids of queue q to its ready list's push; room sizes a new one.
func (b *moveBuild) push(q string, room int, ids ...interface{}) {
	if b.ready[q] == nil {
		b.ready[q] = append(make([]interface{}, 0, 1+room), b.s.Keys.Ready(q))
	}
	b.ready[q] = append(b.ready[q], ids...)
}

// dropMember removes bucket i's index member, and its retry count with
// it when it has one (c is its index in counts).
func (b *moveBuild) dropMember(i, c int) {
	b.zrem = append(b.zrem, b.p.buckets[i].memberArg)
	if b.counted[c] {
		b.hdel = append(b.hdel, b.p.buckets[i].memberArg)
	}
}

// takeInline takes inline entry i (a task in the index itself), if it is
// still there: gone (nil), another transaction took it since the index
// was read, and bumped its guard after our read.
func (b *moveBuild) takeInline(i int, bk moveBucket) {
	if b.badQ[bk.q] {
		return
	}
	if _, ok := b.reps[i].([]byte); !ok {
		b.res.Stale++
		return
	}
	b.zrem = append(b.zrem, bk.memberArg)
	b.touched |= 1 << bk.guard
	b.res.Buckets++
	b.res.Tasks++
	b.push(bk.q, len(b.p.buckets)-i, bk.id)
	if b.moved != nil {
		b.moved.Buckets = append(b.moved.Buckets, MovedBucket{Queue: bk.q, Key: bk.key, Member: bk.member, IDs: []string{bk.id}, Inline: true})
	}
}

// takeList takes bucket list i (c: its index in counts): whole, or its
// share of the move (a bucket larger than its share is trimmed and stays
// in the index). A bucket that is not a list is set aside, so that it
// stops hiding the buckets behind it; an empty one is dropped.
func (b *moveBuild) takeList(i, c int, bk moveBucket) {
	if b.badQ[bk.q] {
		return
	}
	tx, s := b.tx, b.s
	ids, err := redis.Values(b.reps[i], nil)
	if err == nil && !allBulk(ids) {
		err = errNotBulk
	}
	switch {
	case err != nil:
		tx.Queue("RENAME", bk.key, s.Keys.Quarantine(bk.key))
		b.dropMember(i, c)
		b.res.Quarantined = append(b.res.Quarantined, bk.key)
		return
	case len(ids) == 0:
		b.dropMember(i, c)
		b.res.Stale++
		return
	case len(ids) > b.p.share:
		ids = ids[:b.p.share]
		tx.Queue("LTRIM", bk.key, b.p.share, -1)
		if r := min(b.counts[c], len(ids)); r > 0 {
			tx.Queue("HINCRBY", s.Keys.RetryCounts(), bk.member, -r)
		}
		b.res.Partial = true
	default:
		b.del = append(b.del, bk.keyArg)
		b.dropMember(i, c)
		b.res.Buckets++
	}
	b.retries[bk.q] += min(b.counts[c], len(ids))
	b.push(bk.q, len(ids)*(len(b.p.buckets)-i), ids...)
	b.res.Tasks += len(ids)
	if b.moved != nil {
		b.moved.Buckets = append(b.moved.Buckets, MovedBucket{Queue: bk.q, Key: bk.key, Member: bk.member, raw: ids})
	}
}

// pushReady pushes each queue's ids to its ready list (with its wake-up)
// and moves its gauges from scheduled and retrying to ready.
func (b *moveBuild) pushReady() {
	tx, s := b.tx, b.s
	for _, q := range b.p.queues {
		args := b.ready[q]
		if len(args) <= 1 {
			continue
		}
		ids := args[1:]
		s.pushReadyArgs(tx, q, args, len(ids), false)
		if n := len(ids) - b.retries[q]; n > 0 {
			tx.Queue("HINCRBY", s.Keys.Stats(q), StatScheduled, -n)
		}
		if r := b.retries[q]; r > 0 {
			tx.Queue("HINCRBY", s.Keys.Stats(q), StatRetrying, -r)
		}
	}
}

// dropTaken deletes the buckets taken whole, their index members and
// retry counts, and bumps the guard of every inline entry removed, so
// that a concurrent remover that read it fails and reads again.
func (b *moveBuild) dropTaken() {
	tx := b.tx
	if len(b.del) > 0 {
		tx.Queue("DEL", b.del...)
	}
	if len(b.zrem) > 1 {
		tx.Queue("ZREM", b.zrem...)
	}
	if len(b.hdel) > 1 {
		tx.Queue("HDEL", b.hdel...)
	}
	for i, g := range b.p.guards {
		if b.touched&(1<<g) != 0 {
			tx.Queue("INCR", b.p.gkeys[i])
		}
	}
}

// Move moves the buckets named by members (as DueBuckets returns them) to
// their queues' ready lists in one optimistic transaction, at most
// maxTasks ids in all. A bucket larger than its share moves in part; the
// rest stays in the bucket and in the index for the next call.
//
// WATCH   b:<q>:<ts> ...                 every bucket named
// read    LRANGE b 0 share (pipelined), TYPE q:<q> per queue, HMGET rc
// queue   see build
//
// Why it is exact: any push into a watched bucket (a producer whose clock
// is behind ours, say) or another dispatcher's move of it makes EXEC
// answer nil, and the read is done again. The index is not watched: a
// producer adding a member for a new bucket does not conflict, and the
// member removal names only the buckets taken whole, so a bucket added
// meanwhile keeps its index entry. A crash anywhere before EXEC leaves
// everything in its bucket; EXEC applies all of it.
func (s *Store) Move(ctx context.Context, conn redis.Conn, members []string, maxTasks int) (MoveResult, error) {
	p := s.plan(members, nil, maxTasks, false)
	var res MoveResult
	_, err := s.run(ctx, conn, p.watch(), func(tx *txn.Tx) error {
		if err := s.sendReads(tx.Send, p); err != nil {
			return err
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		res = s.build(tx, p, reps, nil)
		return nil
	})
	if err != nil {
		return MoveResult{}, fmt.Errorf("buckets: move %d buckets: %w", len(members), err)
	}
	return res, nil
}

// MoveOpts is what one MoveDue moves.
type MoveOpts struct {
	Now       int64 // Unix ms: buckets due at or before it
	Chunk     int   // buckets per transaction, at most
	MaxTasks  int   // ids per transaction, at most
	Lookahead int   // index members read at a time
	// Window picks which Lookahead-sized window of the due buckets to
	// read first (0 is the earliest).
	Window int
	// Gate, when not nil, is asked before a window read full moves.
	Gate func() (bool, error)
}

// MoveDue moves the buckets due at o.Now, at most o.Chunk buckets and
// o.MaxTasks ids per transaction, reading up to o.Lookahead index members
// at a time;
// when every bucket read would fit in one transaction they are dealt out
// to several smaller ones (see planSize).
// It is Move many times over, made faster in two ways. Each transaction's
// MULTI/EXEC travels in the same round trip as the next one's WATCH and
// reads, so a backlog of small buckets costs about one round trip per
// transaction instead of three. And with more than one connection the
// transactions are dealt out to lanes, one per connection, that run at
// once on disjoint buckets, so the client prepares one lane's next
// transaction while the server runs another's.
//
// A transaction that meets a conflict (another dispatcher took a bucket, a
// producer pushed into one) is left for the next call, which reads those
// buckets again. MoveResult.Partial says that more may be due: a full
// lookahead, or a bucket moved in part.
//
// o.Window picks which lookahead-sized window of the due buckets to read
// first (0 is the earliest): dispatchers that start in different windows
// of a large backlog do not reach for the same buckets. If that window is
// empty, the earliest is read instead. MoveResult.Window and WindowFull
// say which was read and whether it was full.
//
// o.Gate, when not nil, is asked before anything moves whether to move a
// window that was read full (a backlog): the dispatcher takes its turn
// there (TakeTurn). It may use conns[0]. When it answers false, MoveDue
// moves nothing and says so (MoveResult.Gated).
func (s *Store) MoveDue(ctx context.Context, conns []redis.Conn, o MoveOpts) (MoveResult, error) {
	now, chunk, maxTasks, lookahead, window, gate := o.Now, o.Chunk, o.MaxTasks, o.Lookahead, o.Window, o.Gate
	members, boxed, err := s.dueMembers(ctx, conns[0], now, window*lookahead, lookahead)
	if err == nil && len(members) == 0 && window > 0 {
		window = 0
		members, boxed, err = s.dueMembers(ctx, conns[0], now, 0, lookahead)
	}
	if err != nil || len(members) == 0 {
		return MoveResult{}, err
	}
	if gate != nil && len(members) == lookahead {
		ok, err := gate()
		if err != nil {
			return MoveResult{}, err
		}
		if !ok {
			return MoveResult{Window: window, WindowFull: true, Gated: true}, nil
		}
	}
	chunk = planSize(len(members), chunk)
	lanes := s.deal(members, boxed, chunk, maxTasks, min(len(conns), (len(members)+chunk-1)/chunk))
	results := make([]MoveResult, len(lanes))
	errs := make([]error, len(lanes))
	var wg sync.WaitGroup
	for i := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.moveLane(ctx, conns[i], lanes[i])
		}()
	}
	wg.Wait()
	var total MoveResult
	for i := range lanes {
		total.add(results[i])
	}
	total.Window, total.WindowFull = window, len(members) == lookahead
	if total.WindowFull {
		total.Partial = true
	}
	return total, errors.Join(errs...)
}

// deal cuts the due members into move plans of chunk members and deals
// them out to n lanes. All due buckets are due; each lane takes its
// plans in a random order, which keeps several dispatchers over one
// backlog from all reaching for the same buckets first and conflicting.
// Lanes run at once, so their plans must not watch the same keys: a
// bucket list is watched by its own plan alone, but inline entries share
// Guards guards, so an inline entry goes to the lane its guard names
// (GuardOf mod n), and bucket lists are dealt out in turn.
func (s *Store) deal(members []string, boxed []interface{}, chunk, maxTasks, n int) [][]*movePlan {
	cut := func(ms []string, bs []interface{}) []*movePlan {
		var plans []*movePlan
		for i := 0; i < len(ms); i += chunk {
			j := min(i+chunk, len(ms))
			plans = append(plans, s.plan(ms[i:j], bs[i:j], maxTasks, true))
		}
		rand.Shuffle(len(plans), func(i, j int) { plans[i], plans[j] = plans[j], plans[i] })
		return plans
	}
	inline := false
	if n > 1 {
		for _, m := range members {
			if _, ok := inlineEntry(m); ok {
				inline = true
				break
			}
		}
	}
	if !inline {
		plans := cut(members, boxed)
		lanes := make([][]*movePlan, min(n, len(plans)))
		for j, p := range plans {
			lanes[j%len(lanes)] = append(lanes[j%len(lanes)], p)
		}
		return lanes
	}
	ms := make([][]string, n)
	bs := make([][]interface{}, n)
	turn := 0
	for i, m := range members {
		k := turn % n
		if id, ok := inlineEntry(m); ok {
			k = GuardOf(id) % n
		} else {
			turn++
		}
		ms[k] = append(ms[k], m)
		bs[k] = append(bs[k], boxed[i])
	}
	lanes := make([][]*movePlan, 0, n)
	for k := range ms {
		if len(ms[k]) > 0 {
			lanes = append(lanes, cut(ms[k], bs[k]))
		}
	}
	return lanes
}

// A round whose due buckets would all fit in one transaction deals them
// out to up to minPlans transactions of minPlanBuckets buckets or more
// (the last may hold fewer).
const (
	minPlans       = 32
	minPlanBuckets = 4
)

// planSize returns how many buckets each move transaction of a round over
// n due buckets takes. Past chunk buckets it is chunk. Up to chunk, it
// is what spreads them over up to minPlans transactions of at least
// minPlanBuckets: few due buckets are most often large ones (a burst), and
// one transaction for all of them would give each bucket a small share of
// the task bound, move them in parts over several rounds, keep one lane
// busy out of DispatchLanes, and make every other dispatcher conflict on
// the same WATCH. Smaller transactions move whole buckets on every lane,
// and dispatchers that start on different ones (the order is shuffled)
// seldom meet. A due list of minPlanBuckets or fewer stays one
// transaction.
func planSize(n, chunk int) int {
	if n > chunk {
		return chunk
	}
	return min(chunk, max(minPlanBuckets, (n+minPlans-1)/minPlans))
}

// discard is a queuer that keeps nothing: build run again only to learn
// what a move took.
type discard struct{}

func (discard) Queue(string, ...interface{}) {}

// moveLane runs plans on one connection as one txn pipeline: each plan's
// MULTI/EXEC travels with the next plan's WATCH and reads. A plan that
// meets a conflict is counted and left for the next call.
func (s *Store) moveLane(ctx context.Context, conn redis.Conn, plans []*movePlan) (MoveResult, error) {
	steps := make([]txn.Step, len(plans))
	results := make([]MoveResult, len(plans))
	// read holds each step's reads as its writes were built from them
	// (nil: not built). Only a step whose outcome goes unseen needs to
	// know what it took from each bucket: build tells that again then,
	// from the same reads.
	read := make([][]interface{}, len(plans))
	for i, p := range plans {
		reads := make(cmdList, 0, len(p.buckets)+len(p.queues)+1)
		s.sendReads(func(name string, args ...interface{}) error { reads.Queue(name, args...); return nil }, p)
		steps[i] = txn.Step{Watch: p.watch(), WatchArgs: p.watchArgs(), Reads: reads, Build: func(reps []interface{}, q *txn.Cmds) error {
			results[i] = s.build(q, p, reps, nil)
			read[i] = reps
			return nil
		}}
	}
	out, err := s.runner.Pipeline(ctx, conn, steps)
	var total MoveResult
	var errs []error
	for i, r := range out {
		switch {
		case errors.Is(r.Err, txn.ErrConflict):
			total.Conflicts++
		case r.Err != nil:
			// EXEC ran but a push into a ready list failed on a key of
			// the wrong type (written between the step's TYPE read and its
			// EXEC): the buckets are gone, so place their tasks again.
			if ok, rerr := s.repairPlacement(ctx, conn, r.Replies, r.Err); rerr == nil && ok {
				total.add(results[i])
				continue
			}
			errs = append(errs, fmt.Errorf("buckets: move %d buckets: %w", len(plans[i].buckets), r.Err))
		default:
			total.add(results[i])
		}
	}
	if err != nil {
		// The step in flight, if its writes were built, may have
		// committed unseen (the connection failed after its EXEC was
		// sent): its caller settles it (SettleMove).
		if k := len(out); k < len(plans) && read[k] != nil {
			var moved UncertainMove
			s.build(discard{}, plans[k], read[k], &moved)
			if len(moved.Buckets) > 0 {
				moved.spell()
				total.Uncertain = append(total.Uncertain, moved)
			}
		}
		errs = append(errs, fmt.Errorf("buckets: move: %w", err))
	}
	return total, errors.Join(errs...)
}
