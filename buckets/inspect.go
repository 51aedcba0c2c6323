package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// The inspector's reads. Each reads a bounded number of elements per call
// (the caller's limit), and those that must agree with each other are read
// in one MULTI/EXEC of reads, which Redis runs as one atomic step: a
// snapshot, with no WATCH (nothing is written).

// snapshot runs cmds (reads) in one MULTI/EXEC and returns one reply per
// command. An error reply of one command (a key of the wrong type) is left
// in its place for the caller to judge, as redigo's converters do.
func (s *Store) snapshot(ctx context.Context, conn redis.Conn, cmds cmdList) ([]interface{}, error) {
	reps, err := s.exec(ctx, conn, cmds)
	var ee *txn.ExecError
	if err != nil && errors.As(err, &ee) && !ee.Queued && len(reps) == len(cmds) {
		return reps, nil
	}
	if err != nil {
		return nil, err
	}
	return reps, nil
}

// QueueSnapshot is one queue's figures read in one atomic step.
type QueueSnapshot struct {
	Queue                                                     string
	Ready                                                     int64    // LLEN q:<q>, summed over its levels
	Scheduled, Retrying, Running, Dead                        int64    // gauges
	Processed, Failed, Recovered, Cancelled, Snoozed, Expired int64    // totals
	Held                                                      int64    // claims that gave a task back for its flow control
	OldestReady                                               []string // the id at the pop end of each level's list that has one
	SlotsInUse                                                int64    // slots in use (sl:<q>)
	Limits                                                    Limits   // the queue's flow control (lim:<q>)
	KeysWaiting                                               int64    // keys in turn, with tasks waiting (ZCARD of its levels' rotations)
	Err                                                       error    // what could not be read, if anything
}

// QueueNames lists every queue ever enqueued to, sorted.
func (s *Store) QueueNames(ctx context.Context, conn redis.Conn) ([]string, error) {
	qs, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Queues()))
	if err != nil {
		return nil, fmt.Errorf("buckets: queues: %w", err)
	}
	sort.Strings(qs)
	return qs, nil
}

// Levels reads the levels set (Keys.Levels, one SMEMBERS) and returns
// the places of every queue's levels above 1 that were ever made ready,
// by queue, in level order.
func (s *Store) Levels(ctx context.Context, conn redis.Conn) (map[string][]string, error) {
	ms, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Levels()))
	if err != nil {
		return nil, fmt.Errorf("buckets: levels: %w", err)
	}
	return LevelPlaces(ms), nil
}

// LevelPlaces sorts the members of the levels set (places of levels above
// 1, and "p#", the marker of level p's keyed tasks) by queue, each
// queue's in level order, a level's marker after its place ("q#" before
// "q@2", "q@2" before "q@2#"); members that are not such a place are left
// out.
func LevelPlaces(members []string) map[string][]string {
	out := map[string][]string{}
	for _, m := range members {
		if base, ok := strings.CutSuffix(m, "#"); ok {
			// The marker of a level's keyed tasks (Keys.Rotation).
			if q, lvl := SplitPlace(base); ValidName(q) && Place(q, lvl) == base {
				out[q] = append(out[q], m)
			}
		} else if q, lvl := SplitPlace(m); lvl > 1 && ValidName(q) && Place(q, lvl) == m {
			out[q] = append(out[q], m)
		}
	}
	for _, ps := range out {
		sort.Strings(ps) // "q@2" < "q@3" < "q@4"
	}
	return out
}

// placesOf is queue q's places whose ready lists a figure reads: q itself
// (level 1), then its levels in use (levels, from Levels).
func placesOf(q string, levels map[string][]string) []string {
	out := []string{q}
	for _, p := range levels[q] {
		if !strings.HasSuffix(p, "#") {
			out = append(out, p)
		}
	}
	return out
}

// rotationsOf is the rotations of queue q's levels with keyed tasks, as
// the levels set names them ("p#" markers).
func rotationsOf(q string, levels map[string][]string) []string {
	var out []string
	for _, p := range levels[q] {
		if lvl, ok := strings.CutSuffix(p, "#"); ok {
			out = append(out, lvl)
		}
	}
	return out
}

// Snapshot reads the counters, ready length and oldest ready id of every
// queue in qs in one MULTI/EXEC (queueFigures), after the levels set (one
// SMEMBERS): five commands per queue that never used a level above 1,
// whatever the number of tasks.
func (s *Store) Snapshot(ctx context.Context, conn redis.Conn, qs []string) ([]QueueSnapshot, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	levels, err := s.Levels(ctx, conn)
	if err != nil {
		return nil, err
	}
	var cmds cmdList
	for _, q := range qs {
		s.queueFigures(&cmds, q, levels)
	}
	reps, err := s.snapshot(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: queue figures: %w", err)
	}
	out := make([]QueueSnapshot, len(qs))
	for i, q := range qs {
		out[i], reps = readQueueFigures(reps, q, levels)
	}
	return out, nil
}

// queueFigures queues the reads of queue q's figures: HGETALL st:<q>, GET
// sl:<q>, HGET lim:<q> max_running, and LLEN and LINDEX -1 of each of its
// levels' ready lists (level 1 and those levels names).
func (s *Store) queueFigures(cmds *cmdList, q string, levels map[string][]string) {
	cmds.Queue("HGETALL", s.Keys.Stats(q))
	cmds.Queue("GET", s.Keys.Slots(q))
	cmds.Queue("HMGET", append([]interface{}{s.Keys.Limit(q)}, limitFields...)...)
	for _, p := range placesOf(q, levels) {
		cmds.Queue("LLEN", s.Keys.Ready(p))
		cmds.Queue("LINDEX", s.Keys.Ready(p), -1)
	}
	for _, p := range rotationsOf(q, levels) {
		cmds.Queue("ZCARD", s.Keys.Rotation(p))
	}
}

// readQueueFigures reads the replies of queueFigures for queue q from the
// front of reps, and returns the rest. What could not be read is in Err,
// each failed read naming the queue; the other figures are read all the
// same.
func readQueueFigures(reps []interface{}, q string, levels map[string][]string) (QueueSnapshot, []interface{}) {
	st := QueueSnapshot{Queue: q}
	var errs []error
	if m, err := redis.Int64Map(reps[0], nil); err == nil {
		st.Scheduled, st.Retrying, st.Running = m[StatScheduled], m[StatRetrying], m[StatRunning]
		st.Dead, st.Processed, st.Failed = m[StatDead], m[StatProcessed], m[StatFailed]
		st.Recovered, st.Cancelled, st.Snoozed, st.Expired = m[StatRecovered], m[StatCancelled], m[StatSnoozed], m[StatExpired]
		st.Held = m[StatHeld]
	} else {
		errs = append(errs, fmt.Errorf("buckets: queue %s: counters: %w", q, err))
	}
	if lim, err := limitsOf(reps[2]); err == nil {
		st.Limits = lim
	} else {
		errs = append(errs, fmt.Errorf("buckets: queue %s: %w", q, err))
	}
	st.SlotsInUse, _ = redis.Int64(reps[1], asError(reps[1]))
	reps = reps[3:]
	for range placesOf(q, levels) {
		if n, err := redis.Int64(reps[0], nil); err == nil {
			st.Ready += n
		} else {
			errs = append(errs, fmt.Errorf("buckets: queue %s: ready length: %w", q, err))
		}
		if id, err := redis.String(reps[1], nil); err == nil {
			st.OldestReady = append(st.OldestReady, id)
		} else if !errors.Is(err, redis.ErrNil) {
			errs = append(errs, fmt.Errorf("buckets: queue %s: oldest ready: %w", q, err))
		}
		reps = reps[2:]
	}
	for range rotationsOf(q, levels) {
		if n, err := redis.Int64(reps[0], nil); err == nil {
			st.KeysWaiting += n
		} else {
			errs = append(errs, fmt.Errorf("buckets: queue %s: keys waiting: %w", q, err))
		}
		reps = reps[1:]
	}
	st.Err = errors.Join(errs...) // each names the queue
	return st, reps
}

// ReadyWindow reads ids of queue q's ready list by position from the pop
// end (0 is the id a worker takes next), positions lo to hi inclusive,
// together with the list's length, in one MULTI/EXEC (LLEN, LRANGE).
func (s *Store) ReadyWindow(ctx context.Context, conn redis.Conn, q string, lo, hi int64) (ids []string, length int64, err error) {
	var cmds cmdList
	key := s.Keys.Ready(q)
	cmds.Queue("LLEN", key)
	cmds.Queue("LRANGE", key, -(hi + 1), -(lo + 1))
	reps, err := s.snapshot(ctx, conn, cmds)
	if err != nil {
		return nil, 0, fmt.Errorf("buckets: ready list %s: %w", q, err)
	}
	length, err = redis.Int64(reps[0], nil)
	if err != nil {
		return nil, 0, fmt.Errorf("buckets: ready list %s: %w", q, err)
	}
	ids, err = redis.Strings(reps[1], nil)
	if err != nil {
		return nil, 0, fmt.Errorf("buckets: ready list %s: %w", q, err)
	}
	// LRANGE answers head first; the pop end is the tail.
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
	}
	return ids, length, nil
}

// BucketAt is what queue q has at one time of the index, as BucketTimes
// read it: its inline entries (in index order) and whether it has a
// bucket list. Partial says the read may have ended among that time's
// members, so that BucketWindows reads them again.
type BucketAt struct {
	Ts      int64
	Inline  []string
	List    bool
	Partial bool
}

// BucketTimes reads the bucket index from fromTs on, at most scan members
// (ZRANGEBYSCORE sched fromTs +inf WITHSCORES LIMIT 0 scan), and returns
// the times at which queue q has a bucket or inline entries among them,
// each once, in due order, with what q has there, and the time of the
// last member read (any queue's); more says whether the index may hold
// more. A listing treats what q has at one time as one bucket
// (BucketWindows): its inline entries, then its bucket list.
func (s *Store) BucketTimes(ctx context.Context, conn redis.Conn, q string, fromTs int64, scan int) (bs []BucketAt, last int64, more bool, err error) {
	vs, err := redis.Strings(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Schedule(), fromTs, "+inf", "WITHSCORES", "LIMIT", 0, scan))
	if err != nil {
		return nil, 0, false, fmt.Errorf("buckets: bucket index: %w", err)
	}
	last = fromTs
	for i := 0; i+1 < len(vs); i += 2 {
		mq, t, id, err := ParseIndexMember(vs[i])
		if err != nil {
			continue
		}
		if id != "" {
			f, err := strconv.ParseFloat(vs[i+1], 64)
			if err != nil {
				continue
			}
			t = int64(f)
		}
		last = t
		if mq != q {
			continue
		}
		if len(bs) == 0 || bs[len(bs)-1].Ts != t {
			bs = append(bs, BucketAt{Ts: t})
		}
		b := &bs[len(bs)-1]
		if id != "" {
			b.Inline = append(b.Inline, id)
		} else {
			b.List = true
		}
	}
	more = len(vs) == 2*scan
	if n := len(bs); more && n > 0 && bs[n-1].Ts == last {
		bs[n-1].Partial = true
	}
	return bs, last, more, nil
}

// MaxInlineListed bounds the index members at one time that a listing
// reads (BucketWindows, BucketIndexed): the inline entries of every queue
// there. A producer schedules inline only the first task it enqueues for
// a bucket and the rest in the bucket's list (Store.inline), so one time
// seldom has more than a few; beyond this many, a listing leaves the rest
// out.
const MaxInlineListed = 1024

// BucketRange is a window of one bucket to read: ids at head positions Lo
// to Hi inclusive (0 is the next the dispatcher moves). At, when set, is
// what BucketTimes read of the bucket (the time is then At.Ts): a time
// read whole needs no second read of its inline entries, nor an LRANGE
// when it has no list.
type BucketRange struct {
	Ts     int64
	Lo, Hi int64
	At     *BucketAt
}

// BucketWindows reads windows of queue q's buckets in one MULTI/EXEC. The
// bucket at a time is q's inline entries there (in index order), then its
// bucket list: ZRANGEBYSCORE sched ts ts, unless BucketTimes read the
// time whole, and LRANGE of the list unless it read none there. A bucket
// that is gone reads as empty. When q has inline entries at a time whose
// window does not start at 0, the list's part is read again in a second
// step, at the positions the entries move it to.
func (s *Store) BucketWindows(ctx context.Context, conn redis.Conn, q string, rs []BucketRange) ([][]string, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	var cmds cmdList
	index := make([]int, len(rs)) // the reply of each range's index read, or -1
	lists := make([]int, len(rs)) // the reply of each range's LRANGE, or -1
	for i, r := range rs {
		index[i], lists[i] = -1, -1
		if r.At == nil || r.At.Partial {
			index[i] = len(cmds)
			cmds.Queue("ZRANGEBYSCORE", s.Keys.Schedule(), r.Ts, r.Ts, "LIMIT", 0, MaxInlineListed)
		}
		if r.At == nil || r.At.Partial || r.At.List {
			lists[i] = len(cmds)
			cmds.Queue("LRANGE", s.Keys.Bucket(q, r.Ts), r.Lo, r.Hi)
		}
	}
	var reps []interface{}
	if len(cmds) > 0 {
		var err error
		if reps, err = s.snapshot(ctx, conn, cmds); err != nil {
			return nil, fmt.Errorf("buckets: buckets of %s: %w", q, err)
		}
	}
	out := make([][]string, len(rs))
	var again []int // windows whose list part moved
	inl := make([][]string, len(rs))
	for i, r := range rs {
		if index[i] < 0 {
			inl[i] = r.At.Inline
		} else {
			ms, err := redis.Strings(reps[index[i]], nil)
			if err != nil {
				return nil, fmt.Errorf("buckets: bucket index: %w", err)
			}
			for _, m := range ms {
				if mq, _, id, err := ParseIndexMember(m); err == nil && id != "" && mq == q {
					inl[i] = append(inl[i], id)
				}
			}
		}
		var list []string
		if lists[i] >= 0 {
			var err error
			if list, err = redis.Strings(reps[lists[i]], nil); err != nil {
				return nil, fmt.Errorf("buckets: bucket %s: %w", Member(q, r.Ts), err)
			}
		}
		n := int64(len(inl[i]))
		switch {
		case n == 0:
			out[i] = list
		case r.Lo == 0:
			// The entries come first: the list's part starts at 0, and
			// what was read of it (from 0) holds it.
			w := append([]string(nil), inl[i][:min(n, r.Hi+1)]...)
			out[i] = append(w, list[:min(int64(len(list)), max(0, r.Hi+1-n))]...)
		case lists[i] < 0:
			out[i] = append([]string(nil), inl[i][min(n, r.Lo):min(n, r.Hi+1)]...)
		default:
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		var cmds cmdList
		for _, i := range again {
			r, n := rs[i], int64(len(inl[i]))
			cmds.Queue("LRANGE", s.Keys.Bucket(q, r.Ts), max(0, r.Lo-n), max(-1, r.Hi-n))
		}
		reps, err := s.snapshot(ctx, conn, cmds)
		if err != nil {
			return nil, fmt.Errorf("buckets: buckets of %s: %w", q, err)
		}
		for k, i := range again {
			r, n := rs[i], int64(len(inl[i]))
			list, err := redis.Strings(reps[k], nil)
			if err != nil {
				return nil, fmt.Errorf("buckets: bucket %s: %w", Member(q, r.Ts), err)
			}
			var w []string
			if r.Lo < n {
				w = append(w, inl[i][r.Lo:min(n, r.Hi+1)]...)
			}
			if r.Hi-n < 0 {
				list = nil // LRANGE b 0 -1 read the whole list
			}
			out[i] = append(w, list...)
		}
	}
	return out, nil
}

// Scored is a sorted-set member and its score.
type Scored struct {
	ID    string
	Score int64
}

func scored(rep interface{}, err error) ([]Scored, error) {
	vs, err := redis.Strings(rep, err)
	if err != nil {
		return nil, err
	}
	out := make([]Scored, 0, len(vs)/2)
	for i := 0; i+1 < len(vs); i += 2 {
		f, err := strconv.ParseFloat(vs[i+1], 64)
		if err != nil {
			return nil, fmt.Errorf("score %q of %s: %w", vs[i+1], vs[i], ErrMalformed)
		}
		out = append(out, Scored{ID: vs[i], Score: int64(f)})
	}
	return out, nil
}

// DeadPage reads dead letters newest first, starting at score maxScore
// (inclusive; "+inf" for the newest), skipping offset, at most limit:
// ZREVRANGEBYSCORE dead max -inf WITHSCORES LIMIT offset limit. Members
// of equal score come in reverse byte order.
func (s *Store) DeadPage(ctx context.Context, conn redis.Conn, maxScore string, offset, limit int) ([]Scored, error) {
	out, err := scored(do(ctx, conn, "ZREVRANGEBYSCORE", s.Keys.Dead(), maxScore, "-inf", "WITHSCORES", "LIMIT", offset, limit))
	if err != nil {
		return nil, fmt.Errorf("buckets: dead letters: %w", err)
	}
	return out, nil
}

// PendingPage reads worker w's pending set by lease deadline, from
// minScore (inclusive; "-inf" for the first), skipping offset, at most
// limit: ZRANGEBYSCORE p:<w> min +inf WITHSCORES LIMIT offset limit.
// Members of equal score come in byte order.
func (s *Store) PendingPage(ctx context.Context, conn redis.Conn, w, minScore string, offset, limit int) ([]Scored, error) {
	out, err := scored(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Pending(w), minScore, "+inf", "WITHSCORES", "LIMIT", offset, limit))
	if err != nil {
		return nil, fmt.Errorf("buckets: pending set of %s: %w", w, err)
	}
	return out, nil
}

// WorkerSnapshot is what Redis holds about one registered worker process.
type WorkerSnapshot struct {
	ID       string
	Info     []byte   // the heartbeat's value (JSON); nil when the heartbeat is gone
	TTL      int64    // seconds left on the heartbeat; -2 or -1 when gone or without TTL
	Running  int64    // ZCARD p:<w>
	Inflight int64    // LLEN f:<w>
	Tasks    []Scored // up to the first taskLimit of p:<w>, by lease deadline
	Err      error
}

// WorkerSnapshots reads every registered worker in one MULTI/EXEC: per
// worker GET hb:<w>, TTL hb:<w>, ZCARD p:<w>, LLEN f:<w>, and ZRANGE p:<w>
// 0 taskLimit-1 WITHSCORES (after SMEMBERS w).
func (s *Store) WorkerSnapshots(ctx context.Context, conn redis.Conn, taskLimit int) ([]WorkerSnapshot, error) {
	ids, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Workers()))
	if err != nil {
		return nil, fmt.Errorf("buckets: workers: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	sort.Strings(ids)
	var cmds cmdList
	for _, w := range ids {
		cmds.Queue("GET", s.Keys.Heartbeat(w))
		cmds.Queue("TTL", s.Keys.Heartbeat(w))
		cmds.Queue("ZCARD", s.Keys.Pending(w))
		cmds.Queue("LLEN", s.Keys.Inflight(w))
		cmds.Queue("ZRANGE", s.Keys.Pending(w), 0, max(taskLimit, 1)-1, "WITHSCORES")
	}
	reps, err := s.snapshot(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: workers: %w", err)
	}
	out := make([]WorkerSnapshot, len(ids))
	for i, w := range ids {
		r := reps[5*i : 5*i+5]
		ws := WorkerSnapshot{ID: w}
		var errs []error
		if b, err := redis.Bytes(r[0], nil); err == nil {
			ws.Info = b
		} else if !errors.Is(err, redis.ErrNil) {
			errs = append(errs, err)
		}
		ws.TTL, _ = redis.Int64(r[1], nil)
		var e1, e2, e3 error
		ws.Running, e1 = redis.Int64(r[2], nil)
		ws.Inflight, e2 = redis.Int64(r[3], nil)
		ws.Tasks, e3 = scored(r[4], nil)
		if taskLimit <= 0 {
			ws.Tasks = nil
		}
		errs = append(errs, e1, e2, e3)
		if err := errors.Join(errs...); err != nil {
			ws.Err = fmt.Errorf("buckets: worker %s: %w", w, err)
		}
		out[i] = ws
	}
	return out, nil
}

// WorkerIDs lists the registered worker processes, sorted (SMEMBERS w).
func (s *Store) WorkerIDs(ctx context.Context, conn redis.Conn) ([]string, error) {
	ids, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Workers()))
	if err != nil {
		return nil, fmt.Errorf("buckets: workers: %w", err)
	}
	sort.Strings(ids)
	return ids, nil
}

// BucketIndexed reports whether queue q has a bucket or an inline entry
// at ts in the index (ZRANGEBYSCORE sched ts ts: the members at ts, up to
// MaxInlineListed).
func (s *Store) BucketIndexed(ctx context.Context, conn redis.Conn, q string, ts int64) (bool, error) {
	ms, err := redis.Strings(do(ctx, conn, "ZRANGEBYSCORE", s.Keys.Schedule(), ts, ts, "LIMIT", 0, MaxInlineListed))
	if err != nil {
		return false, fmt.Errorf("buckets: bucket index: %w", err)
	}
	for _, m := range ms {
		if mq, _, _, err := ParseIndexMember(m); err == nil && mq == q {
			return true, nil
		}
	}
	return false, nil
}
