package buckets

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// The fields of Keys.Limit: a queue's flow control (Limits).
const (
	LimitMaxRunning    = "max_running"
	LimitRate          = "rate"
	LimitKeyMaxRunning = "key_max_running"
	LimitKeyRate       = "key_rate"
)

// limitFields are the fields of Keys.Limit in the order HMGET reads them.
var limitFields = []interface{}{LimitMaxRunning, LimitRate, LimitKeyMaxRunning, LimitKeyRate}

// Limits is a queue's flow control, as stored in Keys.Limit: limits on how
// many of its tasks run at once and how many start per window, for the
// whole queue and for each key (Record.Key) of it. Zero fields limit
// nothing.
type Limits struct {
	MaxRunning    int64 // tasks of the queue running at once
	Rate          Rate  // starts of the queue in any window
	KeyMaxRunning int64 // tasks of one key running at once
	KeyRate       Rate  // starts of one key in any window
}

// Limited reports whether f limits anything.
func (f Limits) Limited() bool {
	return f.MaxRunning > 0 || f.Rate.N > 0 || f.KeyMaxRunning > 0 || f.KeyRate.N > 0
}

// Single reports whether f needs a claim to read its window or its key's
// slots: a rate or a per-key limit, which a worker claims one task at a
// time for.
func (f Limits) Single() bool { return f.Rate.N > 0 || f.KeyMaxRunning > 0 || f.KeyRate.N > 0 }

// Rate is a sliding-window rate: at most N starts in any window of length
// Per. The zero Rate limits nothing.
type Rate struct {
	N   int64
	Per time.Duration
}

// ParseRate parses "N/period" ("10/1s", "600/1m"; "" is no limit): N at
// least 1, the period a Go duration of 1 ms to 24 h.
func ParseRate(s string) (Rate, error) {
	if s == "" {
		return Rate{}, nil
	}
	ns, ps, ok := strings.Cut(s, "/")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || n < 1 || n > 1<<20 {
		return Rate{}, fmt.Errorf("buckets: rate %q: want N/period, N from 1 to %d: %w", truncate(s, 40), 1<<20, ErrInvalidLimit)
	}
	per, err := time.ParseDuration(ps)
	if err != nil || per < time.Millisecond || per > 24*time.Hour {
		return Rate{}, fmt.Errorf("buckets: rate %q: want a period from 1ms to 24h: %w", truncate(s, 40), ErrInvalidLimit)
	}
	return Rate{N: n, Per: per}, nil
}

// String is the form ParseRate reads; "" for no limit.
func (r Rate) String() string {
	if r.N <= 0 {
		return ""
	}
	return strconv.FormatInt(r.N, 10) + "/" + r.Per.String()
}

// ErrInvalidLimit: a negative concurrency limit or a malformed rate.
var ErrInvalidLimit = errors.New("invalid flow-control limit")

// limitsOf reads the reply to HMGET lim:<q> (limitFields). A field that
// is not a well-formed value limits nothing (the checker reports the
// hash); an error reply (a key of the wrong type, a server still loading
// its data) is an error: a limit that cannot be read is not no limit.
func limitsOf(rep interface{}) (Limits, error) {
	vs, err := redis.Values(rep, asError(rep))
	if err != nil {
		return Limits{}, fmt.Errorf("queue limits: %w", err)
	}
	if len(vs) != len(limitFields) {
		return Limits{}, fmt.Errorf("queue limits: %d values for %d fields", len(vs), len(limitFields))
	}
	n := func(v interface{}) int64 {
		x, err := redis.Int64(v, nil)
		if err != nil || x < 0 {
			return 0
		}
		return x
	}
	r := func(v interface{}) Rate {
		s, err := redis.String(v, nil)
		if err != nil {
			return Rate{}
		}
		rt, err := ParseRate(s)
		if err != nil {
			return Rate{}
		}
		return rt
	}
	return Limits{MaxRunning: n(vs[0]), Rate: r(vs[1]), KeyMaxRunning: n(vs[2]), KeyRate: r(vs[3])}, nil
}

// flowBudget is what a claim read of a limited queue's flow control: the
// limits as stored (under WATCH lim:<q>) and, for those set, the free
// slots and the start that bounds the window, of the queue and of the
// key of the place the ids were popped from. A nil *flowBudget limits
// nothing: the claim takes no slot.
type flowBudget struct {
	flow      Limits
	place     string // the place the ids were popped from
	key       string // its key ("" for none)
	free      int64  // queue slots free, when flow.MaxRunning > 0
	rateAt    int64  // the N-th newest start of the queue (0: fewer than N)
	keyFree   int64  // key slots free, when flow.KeyMaxRunning > 0
	keyRateAt int64  // the N-th newest start of the key (0: fewer than N)
}

// sendFlowReads sends, inside a claim's transaction that watches the keys
// of flowWatch, the reads of a limited queue's flow control for ids popped
// from place p: HMGET lim:<q> (limitFields), GET sl:<q>, LINDEX rl:<q>
// N-1 and, for a key's place, SCARD ks:<q>#<key> and LINDEX rl:<q>#<key>
// N-1, where N is view's count (the worker's last read of the limits;
// flowBudgetOf reads again when the stored count differs). It returns the
// number of replies to expect.
func (s *Store) sendFlowReads(tx *txn.Tx, p string, view Limits) (int, error) {
	q := QueueOf(p)
	_, key := SplitKey(p)
	cmds := []txn.Cmd{
		{Name: "HMGET", Args: append([]interface{}{s.Keys.Limit(q)}, limitFields...)},
		{Name: "GET", Args: []interface{}{s.Keys.Slots(q)}},
		{Name: "LINDEX", Args: []interface{}{s.Keys.RateLog(q), max(view.Rate.N-1, 0)}},
	}
	if key != "" {
		cmds = append(cmds,
			txn.Cmd{Name: "SCARD", Args: []interface{}{s.Keys.KeySlots(q, key)}},
			txn.Cmd{Name: "LINDEX", Args: []interface{}{s.Keys.RateLog(KeyPlace(q, key)), max(view.KeyRate.N-1, 0)}})
	}
	for _, c := range cmds {
		if err := tx.Send(c.Name, c.Args...); err != nil {
			return 0, err
		}
	}
	return len(cmds), nil
}

// flowWatch returns the keys a claim of ids popped from place p watches
// for its flow control: lim:<q>, sl:<q>, rl:<q> and, for a key's place,
// ks:<q>#<key> and rl:<q>#<key>.
func (s *Store) flowWatch(p string) []string {
	q := QueueOf(p)
	_, key := SplitKey(p)
	w := []string{s.Keys.Limit(q), s.Keys.Slots(q), s.Keys.RateLog(q)}
	if key != "" {
		w = append(w, s.Keys.KeySlots(q, key), s.Keys.RateLog(KeyPlace(q, key)))
	}
	return w
}

// flowBudgetOf reads the replies of sendFlowReads for place p; nil when
// the queue limits nothing. A window read at a count other than the
// stored one is read again (LINDEX, one more round trip, under the same
// watch). A count of slots in use that is not a number is an error (the
// checker repairs it).
func (s *Store) flowBudgetOf(tx *txn.Tx, p string, view Limits, reps []interface{}) (*flowBudget, error) {
	f, err := limitsOf(reps[0])
	if err != nil {
		return nil, err
	}
	if !f.Limited() {
		return nil, nil
	}
	q := QueueOf(p)
	_, key := SplitKey(p)
	b := &flowBudget{flow: f, place: p, key: key}
	if f.MaxRunning > 0 {
		u, err := redis.Int64(reps[1], asError(reps[1]))
		if err != nil && !errors.Is(err, redis.ErrNil) {
			return nil, fmt.Errorf("slots in use: %w", err)
		}
		b.free = f.MaxRunning - u
	}
	at := func(rep interface{}, name string, n, viewN int64) (int64, error) {
		if n <= 0 {
			return 0, nil
		}
		if n != viewN {
			rep = nil
			v, err := tx.Do("LINDEX", s.Keys.RateLog(name), n-1)
			if err != nil && !IsServerError(err) {
				return 0, err
			}
			if err == nil {
				rep = v
			}
		}
		t, err := redis.Int64(rep, asError(rep))
		if err != nil {
			return 0, nil // fewer than n starts, or not a time: no bound
		}
		return t, nil
	}
	if b.rateAt, err = at(reps[2], q, f.Rate.N, view.Rate.N); err != nil {
		return nil, err
	}
	if key != "" && len(reps) >= 5 {
		if f.KeyMaxRunning > 0 {
			u, err := redis.Int64(reps[3], asError(reps[3]))
			if err != nil {
				return nil, fmt.Errorf("key slots in use: %w", err)
			}
			b.keyFree = f.KeyMaxRunning - u
		}
		if b.keyRateAt, err = at(reps[4], KeyPlace(q, key), f.KeyRate.N, view.KeyRate.N); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// slotBudgetOf reads the replies of GET sl:<q> and HGET lim:<q>
// max_running (a batch's reads: a batch is claimed only for a queue
// whose flow control is its concurrency limit alone): nil when the queue
// has no limit. A value that is not a number is an error (the checker
// repairs it).
func slotBudgetOf(used, limit interface{}) (*flowBudget, error) {
	n, err := redis.Int64(limit, asError(limit))
	if errors.Is(err, redis.ErrNil) || err == nil && n <= 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("queue limit: %w", err)
	}
	u, err := redis.Int64(used, asError(used))
	if err != nil && !errors.Is(err, redis.ErrNil) {
		return nil, fmt.Errorf("slots in use: %w", err)
	}
	return &flowBudget{flow: Limits{MaxRunning: n}, free: n - u}, nil
}

// sendSlotReads sends, inside a batch claim's transaction, the reads of
// queue q's slots in use and limit: GET sl:<q>, HGET lim:<q> max_running.
func (s *Store) sendSlotReads(tx *txn.Tx, q string) error {
	if err := tx.Send("GET", s.Keys.Slots(q)); err != nil {
		return err
	}
	return tx.Send("HGET", s.Keys.Limit(q), LimitMaxRunning)
}

// check decides whether a task of key (its record's, "" for none) may
// start at now: Claimed, or why not and until when to set it aside: Full
// (the queue's slots), Throttled (the queue's window), KeyFull (the key's
// slots) or KeyThrottled (the key's window). A key other than the place's counts no key
// limit (a task found in another list than its key's).
func (b *flowBudget) check(key string, now int64) (ClaimResult, int64) {
	if b == nil {
		return Claimed, 0
	}
	f := b.flow
	if f.MaxRunning > 0 && b.free <= 0 {
		return Full, now + int64(limitLook/time.Millisecond)
	}
	if f.Rate.N > 0 && b.rateAt > 0 && b.rateAt+f.Rate.Per.Milliseconds() > now {
		return Throttled, b.rateAt + f.Rate.Per.Milliseconds()
	}
	if key == "" || key != b.key {
		return Claimed, 0
	}
	if f.KeyMaxRunning > 0 && b.keyFree <= 0 {
		return KeyFull, 0
	}
	if f.KeyRate.N > 0 && b.keyRateAt > 0 && b.keyRateAt+f.KeyRate.Per.Milliseconds() > now {
		return KeyThrottled, b.keyRateAt + f.KeyRate.Per.Milliseconds()
	}
	return Claimed, 0
}

// limitLook is how long a queue or a key found full is set aside when no
// slot given back ends it sooner.
const limitLook = time.Second

// take queues, for task r claimed at now after check said so, the slots
// and window entries it takes: INCR sl:<q>; LPUSH rl:<q> now; LTRIM
// rl:<q> 0 N-1; SADD ks:<q>#<key> id; LPUSH/LTRIM/EXPIRE rl:<q>#<key>,
// those of the limits set, and the record's flags.
func (s *Store) take(wq queuer, b *flowBudget, r *Record, now int64) {
	if b == nil {
		return
	}
	f := b.flow
	if f.MaxRunning > 0 {
		b.free--
		wq.Queue("INCR", s.Keys.Slots(r.Queue))
		r.HoldsSlot = true
	}
	if f.Rate.N > 0 {
		wq.Queue("LPUSH", s.Keys.RateLog(r.Queue), now)
		wq.Queue("LTRIM", s.Keys.RateLog(r.Queue), 0, f.Rate.N-1)
	}
	if r.Key == "" || r.Key != b.key {
		return
	}
	if f.KeyMaxRunning > 0 {
		b.keyFree--
		wq.Queue("SADD", s.Keys.KeySlots(r.Queue, r.Key), r.ID)
		r.HoldsKeySlot = true
	}
	if f.KeyRate.N > 0 {
		// A key's log expires a period after its last start, when no
		// entry of it counts any more: a key without tasks costs nothing.
		name := s.Keys.RateLog(KeyPlace(r.Queue, r.Key))
		wq.Queue("LPUSH", name, now)
		wq.Queue("LTRIM", name, 0, f.KeyRate.N-1)
		wq.Queue("EXPIRE", name, int64(math.Ceil(f.KeyRate.Per.Seconds()))+1)
	}
}

// releaseSlot queues, for a record leaving the running state at now, the
// return of the slots it holds, and clears its flags (before the caller
// encodes it): for the queue's, DECR sl:<q> and a token on sw:<q>
// (queueTokens, as the queues' wake-up lists); for its key's, SREM ks:<q>#<key> id; ZADD kr:<p> now key
// (the key in turn again, at once); LPUSH/LTRIM n:<q> (wake a worker).
func (s *Store) releaseSlot(tx queuer, r *Record, now int64) {
	if r.HoldsSlot {
		r.HoldsSlot = false
		tx.Queue("DECR", s.Keys.Slots(r.Queue))
		s.queueTokens(tx, s.Keys.SlotWake(r.Queue), 1, "1")
	}
	if r.HoldsKeySlot {
		r.HoldsKeySlot = false
		tx.Queue("SREM", s.Keys.KeySlots(r.Queue, r.Key), r.ID)
		p, _ := SplitKey(r.Place())
		tx.Queue("ZADD", s.Keys.Rotation(p), now, r.Key)
		s.queueTokens(tx, s.Keys.Notify(r.Queue), 1, "1")
	}
}

// SetQueueLimits sets queue q's flow control to f, all fields at once
// (HMSET lim:<q> of the set ones, HDEL of the others; SADD queues q), in
// one MULTI without a WATCH. Slots in use and windows are left as they
// are: runs that hold a slot give it back when they end, and workers
// learn of the change within a second.
func (s *Store) SetQueueLimits(ctx context.Context, conn redis.Conn, q string, f Limits) error {
	if f.MaxRunning < 0 || f.KeyMaxRunning < 0 || f.Rate.N < 0 || f.KeyRate.N < 0 {
		return fmt.Errorf("buckets: flow of %s: a negative limit: %w", q, ErrInvalidLimit)
	}
	for _, r := range []Rate{f.Rate, f.KeyRate} {
		if r.N > 0 {
			if _, err := ParseRate(r.String()); err != nil {
				return err
			}
		}
	}
	set := []interface{}{s.Keys.Limit(q)}
	del := []interface{}{s.Keys.Limit(q)}
	for i, v := range []interface{}{f.MaxRunning, f.Rate.String(), f.KeyMaxRunning, f.KeyRate.String()} {
		if v == int64(0) || v == "" {
			del = append(del, limitFields[i])
		} else {
			set = append(set, limitFields[i], v)
		}
	}
	var cmds cmdList
	if len(del) > 1 {
		cmds.Queue("HDEL", del...)
	}
	if len(set) > 1 {
		cmds.Queue("HMSET", set...)
		cmds.Queue("SADD", s.Keys.Queues(), q)
	}
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: set flow of %s: %w", q, err)
	}
	return nil
}

// QueueLimits reads the flow control of queues qs in one round trip (HMGET
// lim:<q> each, pipelined): the zero Limits for a queue without any.
func (s *Store) QueueLimits(ctx context.Context, conn redis.Conn, qs []string) ([]Limits, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	cmds := make([]txn.Cmd, len(qs))
	for i, q := range qs {
		cmds[i] = txn.Cmd{Name: "HMGET", Args: append([]interface{}{s.Keys.Limit(q)}, limitFields...)}
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: queue limits: %w", err)
	}
	out := make([]Limits, len(qs))
	for i, rep := range reps {
		if out[i], err = limitsOf(rep); err != nil {
			return nil, fmt.Errorf("buckets: queue %s: %w", qs[i], err)
		}
	}
	return out, nil
}

// rotationPick is how many keys in turn a pop reads: it tries them in
// turn order until one yields tasks (a key another worker emptied just
// before yields none).
const rotationPick = 8

// PopKey takes up to n tasks of one key of place p (a queue's level) into
// worker w's in-flight list, the key taken in turn from the level's
// rotation (Keys.Rotation): the least recently served key whose time has
// come (ZRANGEBYSCORE kr:<p> -inf now LIMIT 0 8, the next ones tried when
// it has nothing; with ZRANGE kr:<p> 0 0 WITHSCORES for when the next one
// comes), then
//
//	WATCH  q:<p#key>
//	read   LLEN q:<p#key>
//	MULTI  RPOPLPUSH q:<p#key> f:<w> (up to n times);
//	       ZADD kr:<p> now key (back of the turn), or ZREM kr:<p> key
//	       when that empties the list
//	EXEC
//
// A push to the key's list between the read and EXEC (which adds the key
// to the rotation itself) makes EXEC fail and the pop try again. It
// returns the key's place (KeyPlace) and the ids, or none and when the
// next key's time comes (0: no key waits).
func (s *Store) PopKey(ctx context.Context, conn redis.Conn, p, w string, n int, now int64) (place string, ids []string, next int64, err error) {
	rot := s.Keys.Rotation(p)
	reps, err := pipeline(ctx, conn, []txn.Cmd{
		{Name: "ZRANGEBYSCORE", Args: []interface{}{rot, "-inf", now, "LIMIT", 0, rotationPick}},
		{Name: "ZRANGE", Args: []interface{}{rot, 0, 0, "WITHSCORES"}},
	})
	if err != nil {
		return "", nil, 0, fmt.Errorf("buckets: pop a key of %s: %w", p, err)
	}
	keys, err := redis.Strings(reps[0], asError(reps[0]))
	if err != nil {
		return "", nil, 0, fmt.Errorf("buckets: rotation of %s: %w", p, err)
	}
	if len(keys) == 0 {
		if first, err := redis.Strings(reps[1], asError(reps[1])); err == nil && len(first) == 2 {
			next, _ = strconv.ParseInt(first[1], 10, 64)
		}
		return "", nil, next, nil
	}
	for _, key := range keys {
		if !ValidName(key) {
			// Not a key a task can have: nothing waits under it.
			if _, err := do(ctx, conn, "ZREM", rot, key); err != nil {
				return "", nil, 0, fmt.Errorf("buckets: rotation of %s: %w", p, err)
			}
			continue
		}
		kp := KeyPlace(p, key)
		list := s.Keys.Ready(kp)
		var m int
		reps, err := s.runner.Run(ctx, conn, []string{list}, func(tx *txn.Tx) error {
			l, err := redis.Int(tx.Do("LLEN", list))
			if err != nil {
				return err
			}
			m = min(n, l)
			for range m {
				tx.Queue("RPOPLPUSH", list, s.Keys.Inflight(w))
			}
			if l <= m {
				tx.Queue("ZREM", rot, key)
			} else {
				tx.Queue("ZADD", rot, now, key)
			}
			return nil
		})
		if err != nil {
			return kp, nil, 0, fmt.Errorf("buckets: pop key %s of %s: %w", key, p, err)
		}
		for _, rep := range reps[:m] {
			if id, err := redis.String(rep, nil); err == nil {
				ids = append(ids, id)
			}
		}
		if len(ids) > 0 {
			return kp, ids, 0, nil
		}
	}
	return "", nil, 0, nil
}

// KeyFigures is one key of a queue with tasks waiting, as its level's
// rotation and its lists say.
type KeyFigures struct {
	Key     string
	Waiting int64 // tasks in its lists (LLEN), over the levels
	Running int64 // its slots in use (SCARD ks:<q>#<key>)
	Next    int64 // when it next comes in turn (Unix ms): the earliest of its levels' scores
}

// KeysWaiting reads up to n keys of queue q that have tasks waiting, in turn
// order (each level's rotation, ZRANGE kr:<p> 0 n-1 WITHSCORES, the
// levels named by the levels set), with each key's waiting tasks and its
// slots in use (LLEN and SCARD, pipelined): three round trips.
func (s *Store) KeysWaiting(ctx context.Context, conn redis.Conn, q string, n int) ([]KeyFigures, error) {
	levels, err := s.Levels(ctx, conn)
	if err != nil {
		return nil, err
	}
	rots := rotationsOf(q, levels)
	if len(rots) == 0 {
		return nil, nil
	}
	var cmds []txn.Cmd
	for _, p := range rots {
		cmds = append(cmds, txn.Cmd{Name: "ZRANGE", Args: []interface{}{s.Keys.Rotation(p), 0, n - 1, "WITHSCORES"}})
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: keys of %s: %w", q, err)
	}
	byKey := map[string]*KeyFigures{}
	var order []*KeyFigures
	for _, rep := range reps {
		kv, err := redis.Strings(rep, asError(rep))
		if err != nil {
			return nil, fmt.Errorf("buckets: keys of %s: %w", q, err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			at, _ := strconv.ParseInt(kv[i+1], 10, 64)
			k := byKey[kv[i]]
			if k == nil {
				k = &KeyFigures{Key: kv[i], Next: at}
				byKey[kv[i]] = k
				order = append(order, k)
			}
			k.Next = min(k.Next, at)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].Next < order[j].Next })
	if len(order) > n {
		order = order[:n]
	}
	cmds = cmds[:0]
	for _, k := range order {
		for _, p := range rots {
			cmds = append(cmds, txn.Cmd{Name: "LLEN", Args: []interface{}{s.Keys.Ready(KeyPlace(p, k.Key))}})
		}
		cmds = append(cmds, txn.Cmd{Name: "SCARD", Args: []interface{}{s.Keys.KeySlots(q, k.Key)}})
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	if reps, err = pipeline(ctx, conn, cmds); err != nil {
		return nil, fmt.Errorf("buckets: keys of %s: %w", q, err)
	}
	out := make([]KeyFigures, 0, len(order))
	for _, k := range order {
		for range rots {
			w, _ := redis.Int64(reps[0], asError(reps[0]))
			k.Waiting += w
			reps = reps[1:]
		}
		k.Running, _ = redis.Int64(reps[0], asError(reps[0]))
		reps = reps[1:]
		out = append(out, *k)
	}
	return out, nil
}
