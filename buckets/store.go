package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Stat* are the fields of a queue's counters hash ([Keys.Stats]). Each is
// changed only inside the transaction that makes the transition it counts,
// so the gauges stay exact.
const (
	StatScheduled = "scheduled" // gauge: first attempts in buckets
	StatRetrying  = "retrying"  // gauge: failed, waiting in a bucket to run again
	StatRunning   = "running"   // gauge: claimed by a worker
	StatDead      = "dead"      // gauge: in the dead letters
	StatProcessed = "processed" // counter: succeeded
	StatFailed    = "failed"    // counter: handler runs that failed
	StatRecovered = "recovered" // counter: returned after a worker died or a lease ran out
	StatCancelled = "cancelled" // counter: cancelled before running
	StatSnoozed   = "snoozed"   // counter: runs whose handler snoozed the task
	StatExpired   = "expired"   // counter: tasks buried because they were not started by their expiry
	StatHeld      = "held"      // counter: claims that gave a task back for its flow control (a slot or a window in use)
)

// wakeTokens bounds how many wake-up tokens one transaction pushes to a
// notify list, and how many the list keeps when nobody waits (plus a few
// per Store: see trimEvery).
const wakeTokens = 16

// Store sends the engine's commands for one namespace. Its methods take a
// context, which bounds each of their round trips, and a connection, which
// they leave open; they are safe for concurrent use on different
// connections. Make one with NewStore.
type Store struct {
	Keys Keys
	// Resolution is the bucket width in ms (1 to 60000).
	Resolution int64
	// OnSetAside, when set, is told of each key of the wrong type that a
	// transaction's repair set aside (see repairPlacement), for the log.
	OnSetAside func(key, movedTo string)
	// Redial, when set, returns a fresh connection (the caller closes
	// it). A repair of a placement (repairPlacement) whose connection
	// failed midway tries again on one, so that a cut connection does not
	// leave the tasks it was placing in no list.
	Redial func(ctx context.Context) (redis.Conn, error)
	// OnPlacedAgain, when set, is told how many tasks PlaceAgain placed
	// (when it placed any), for the log: whoever calls it, the Store
	// before a placing transaction or a component on its periodic step.
	OnPlacedAgain func(tasks int)

	// ResultTTL is how long, in seconds, a task's result is kept after it
	// succeeded; 0 keeps none. Completion lists are kept at least
	// MinCompletionTTL.
	ResultTTL int64
	// FlowTTL is how long, in seconds, a workflow's hash is kept after
	// the workflow ended (workflow.go); at least 1.
	FlowTTL int64
	// inlined remembers the buckets this store scheduled an inline entry
	// for (Store.inline): a later task of the same bucket goes to its
	// list, so a burst keeps the list's cost per task, not an entry's.
	inlinedMu sync.Mutex
	inlined   map[bucketRef]struct{}

	// unplaced are the repairs of placements that failed on every try
	// (repairPlacement); PlaceAgain applies them. unplacedN is their
	// number, read without the lock.
	unplacedMu sync.Mutex
	unplaced   []placementFix
	unplacedN  atomic.Int64

	runner txn.Runner // runs every transaction, and counts their conflicts
	known  sync.Map   // queue name → when (Unix ms) an enqueue added it to the set of queues
	pushes sync.Map   // wake-up list key → *atomic.Uint32, its single-token pushes (untrimmed)
}

// NewStore returns a Store for namespace ns and bucket width resolutionMs.
func NewStore(ns string, resolutionMs int64) (*Store, error) {
	keys, err := NewKeys(ns)
	if err != nil {
		return nil, err
	}
	if resolutionMs < 1 || resolutionMs > 60000 {
		return nil, fmt.Errorf("buckets: resolution %d ms: want 1 to 60000", resolutionMs)
	}
	return &Store{Keys: keys, Resolution: resolutionMs}, nil
}

// Conflicts reports how many of the Store's transactions found a watched
// key changed before EXEC (each was retried, or left for the next round).
func (s *Store) Conflicts() int64 { return s.runner.Conflicts() }

func (s *Store) tokens(n int) int { return min(n, wakeTokens) }

// queuer is what the write helpers need: a place to queue commands. Both
// *txn.Tx and a plain command list satisfy it.
type queuer interface {
	Queue(name string, args ...interface{})
}

// pushReady queues the commands that make ids ready on queue q (a place,
// see Place), in order, and wake up to wakeTokens idle workers: LPUSH
// ready ids..., (a level above 1: SADD levels q, nameLevel), LPUSH notify tokens...,
// LTRIM notify to wakeTokens. front puts them at the pop end
// (RPUSH) instead, for tasks that were already at the front.
func (s *Store) pushReady(tx queuer, q string, ids []string, front bool) {
	if len(ids) == 0 {
		return
	}
	args := make([]interface{}, 0, len(ids)+1)
	args = append(args, s.Keys.Ready(q))
	for _, id := range ids {
		args = append(args, id)
	}
	s.pushReadyArgs(tx, q, args, len(ids), front)
}

// pushReadyArgs is pushReady with its command's arguments built: args[0]
// is q's ready list, n ids follow (strings or []byte, as a reply gave them).
func (s *Store) pushReadyArgs(tx queuer, q string, args []interface{}, n int, front bool) {
	if front {
		// RPUSH appends at the tail, which RPOPLPUSH takes next; push in
		// reverse so that the first id is taken first.
		for i, j := 1, len(args)-1; i < j; i, j = i+1, j-1 {
			args[i], args[j] = args[j], args[i]
		}
		tx.Queue("RPUSH", args...)
	} else {
		tx.Queue("LPUSH", args...)
	}
	s.nameLevel(tx, q)
	s.turnKey(tx, q)
	s.queueTokens(tx, s.Keys.Notify(q), n, "1")
}

// nameLevel queues, for a place of a level above 1, its addition to the
// levels set (SADD levels place), and for a key's place the marker of its
// level's rotation (SADD levels "p#"): workers learn from the set which
// lists to pop besides a queue's level 1, and the inspector which ones a
// queue's listings walk. A place of level 1 without a key sends nothing.
func (s *Store) nameLevel(tx queuer, place string) {
	p, key := SplitKey(place)
	if key != "" {
		tx.Queue("SADD", s.Keys.Levels(), p+"#")
	} else if _, lvl := SplitPlace(p); lvl > 1 {
		tx.Queue("SADD", s.Keys.Levels(), p)
	}
}

// turnKey queues, for a key's place that a task is pushed to, the key's
// entry in its level's rotation (ZINCRBY kr:<p> 0 key): added at 0, first
// in turn, when absent; unchanged when present, so a key waiting for its
// rate window keeps its time. Whatever pushes to a key's list sends it in
// the same MULTI, so a key's list that holds tasks is always in turn.
func (s *Store) turnKey(tx queuer, place string) {
	if p, key := SplitKey(place); key != "" {
		tx.Queue("ZINCRBY", s.Keys.Rotation(p), 0, key)
	}
}

// queueTokens pushes up to wakeTokens tokens to a wake-up list and trims it
// to wakeTokens, so that tokens nobody waits for do not pile up. At 2.4 a
// push to a list with a blocked client hands the token straight to it;
// later versions serve blocked clients after EXEC; both wake the waiter.
func (s *Store) queueTokens(tx queuer, key string, n int, token string) {
	n = s.tokens(n)
	args := make([]interface{}, 0, n+1)
	args = append(args, key)
	tok := interface{}(token) // boxed once for all n
	for i := 0; i < n; i++ {
		args = append(args, tok)
	}
	tx.Queue("LPUSH", args...)
	if n == 1 && s.untrimmed(key) {
		return
	}
	tx.Queue("LTRIM", key, 0, s.tokens(1<<30)-1)
}

// trimEvery is how often a Store trims a wake-up list it pushes single
// tokens to: the LTRIM goes with one push in trimEvery, and with every
// push of more than one token. A list therefore holds at most
// wakeTokens + (trimEvery-1) tokens per Store pushing to it, and tokens
// cost no more than a spurious wake-up of an idle waiter each.
const trimEvery = 4

// untrimmed reports whether this push of one token to key may leave the
// LTRIM out: true for all but every trimEvery-th such push by this Store,
// counting from its first (which trims whatever the list holds).
func (s *Store) untrimmed(key string) bool {
	v, ok := s.pushes.Load(key)
	if !ok {
		v, _ = s.pushes.LoadOrStore(key, new(atomic.Uint32))
	}
	return (v.(*atomic.Uint32).Add(1)-1)%trimEvery != 0
}

// scheduleBucket queues the commands that add ids to queue q's bucket at
// ts: RPUSH bucket ids..., ZADD index ts member. The caller wakes the
// dispatchers once (wakeDispatchers) for all the buckets it adds.
func (s *Store) scheduleBucket(tx queuer, q string, ts int64, ids []string) {
	s.pushBucket(tx, q, ts, ids)
	tx.Queue("ZADD", s.Keys.Schedule(), ts, Member(q, ts))
	s.nameLevel(tx, q)
}

// scheduleBuckets queues the writes that place tasks in buckets, given as
// queue -> bucket time -> ids: per queue, in time order, each bucket's
// RPUSH; then one ZADD that indexes every bucket (variadic since 2.4, so
// a group of one-task buckets sends one index command, not one a task;
// a bucket of one task is its task's inline entry, with no RPUSH: see
// inline);
// then per queue HINCRBY st:<q> scheduled by its count. The caller wakes
// the dispatchers.
func (s *Store) scheduleBuckets(tx queuer, sched map[string]map[int64][]string) {
	if len(sched) == 0 {
		return
	}
	qs := sortedKeys(sched)
	zadd := []interface{}{s.Keys.Schedule()}
	counts := make([]int, len(qs))
	for i, q := range qs {
		byTS := sched[q]
		tss := make([]int64, 0, len(byTS))
		for ts := range byTS {
			tss = append(tss, ts)
		}
		sort.Slice(tss, func(i, j int) bool { return tss[i] < tss[j] })
		for _, ts := range tss {
			ids := byTS[ts]
			counts[i] += len(ids)
			if len(ids) == 1 && s.inline(q, ts, ids[0]) {
				zadd = append(zadd, ts, InlineMember(q, ids[0]))
				continue
			}
			s.pushBucket(tx, q, ts, ids)
			zadd = append(zadd, ts, Member(q, ts))
		}
	}
	tx.Queue("ZADD", zadd...)
	for i, q := range qs {
		tx.Queue("HINCRBY", s.Keys.Stats(q), StatScheduled, counts[i])
		s.nameLevel(tx, q)
	}
}

// bucketRef names a bucket: queue and time.
type bucketRef struct {
	q  string
	ts int64
}

// inlineMemory bounds the buckets a store remembers inlining: past it,
// it forgets them all (a later task of one of those buckets then makes a
// second inline entry, which costs memory, never correctness).
const inlineMemory = 4096

// inline reports whether task id, alone in its enqueue's bucket q at ts,
// is scheduled without a bucket list: its index entry names it
// (InlineMember), which saves the list key's memory and the bucket's
// reads and writes at the move. Only the first such task of the bucket
// this store sees is: later tasks of the bucket go to its list (the store
// remembers the last inlineMemory buckets it inlined), so a burst keeps a
// list's cost per task, as do tasks enqueued together for one bucket, ids
// not Inlineable, retries and tasks placed again.
func (s *Store) inline(q string, ts int64, id string) bool {
	if !Inlineable(id) {
		return false
	}
	k := bucketRef{q, ts}
	s.inlinedMu.Lock()
	defer s.inlinedMu.Unlock()
	if _, ok := s.inlined[k]; ok {
		return false
	}
	if s.inlined == nil || len(s.inlined) >= inlineMemory {
		s.inlined = make(map[bucketRef]struct{})
	}
	s.inlined[k] = struct{}{}
	return true
}

// pushBucket queues scheduleBucket's RPUSH alone: the caller indexes the
// bucket.
func (s *Store) pushBucket(tx queuer, q string, ts int64, ids []string) {
	args := make([]interface{}, 0, len(ids)+1)
	args = append(args, s.Keys.Bucket(q, ts))
	for _, id := range ids {
		args = append(args, id)
	}
	tx.Queue("RPUSH", args...)
}

// scheduleRetry queues the commands that put retry id at the front of
// queue q's bucket at ts and count it: LPUSH bucket id, ZADD index ts
// member, HINCRBY rc member 1, HINCRBY st:<q> retrying 1. The front
// segment of a bucket is its retries (Keys.RetryCounts). The caller wakes
// the dispatchers.
func (s *Store) scheduleRetry(tx queuer, q string, ts int64, id string) {
	m := Member(q, ts)
	tx.Queue("LPUSH", s.Keys.Bucket(q, ts), id)
	tx.Queue("ZADD", s.Keys.Schedule(), ts, m)
	tx.Queue("HINCRBY", s.Keys.RetryCounts(), m, 1)
	tx.Queue("HINCRBY", s.Keys.Stats(q), StatRetrying, 1)
	s.nameLevel(tx, q)
}

// unbucketed queues the gauge changes for r, a waiting or retrying task,
// taken out of its bucket one by one (LREM, by the caller): a retry
// leaves the retrying gauge and its bucket's retry count, any other task
// the scheduled gauge. A task taken from its ready list changes no gauge.
func (s *Store) unbucketed(tx queuer, r *Record) {
	st := s.Keys.Stats(r.Queue)
	if r.State == StateRetry {
		tx.Queue("HINCRBY", st, StatRetrying, -1)
		tx.Queue("HINCRBY", s.Keys.RetryCounts(), Member(r.Place(), BucketTime(r.Due, s.Resolution)), -1)
		return
	}
	tx.Queue("HINCRBY", st, StatScheduled, -1)
}

// dropMember queues the removal of index member m of a bucket that is
// gone or going (ZREM index m, HDEL rc m).
func (s *Store) dropMember(tx queuer, m string) {
	tx.Queue("ZREM", s.Keys.Schedule(), m)
	tx.Queue("HDEL", s.Keys.RetryCounts(), m)
}

// wakeDispatchers pushes one token naming the earliest new bucket time to
// the dispatchers' wake list (and trims it).
func (s *Store) wakeDispatchers(tx queuer, ts int64) {
	s.queueTokens(tx, s.Keys.Wake(), 1, strconv.FormatInt(ts, 10))
}

// cmdList collects commands: for a MULTI without a WATCH, or for a
// pipeline of reads.
type cmdList = txn.Cmds

// do sends one command outside any transaction, in a round trip bounded
// by ctx (txn.Do: ctx's deadline bounds the read, and a connection whose
// read was cut short is closed, so a pool discards it). A read cut short
// at ctx's deadline is reported as context.DeadlineExceeded.
func do(ctx context.Context, conn redis.Conn, name string, args ...interface{}) (interface{}, error) {
	return txn.Do(ctx, conn, name, args...)
}

// pipeline sends cmds (reads, outside any transaction) in one round trip
// bounded by ctx and returns the replies in order.
func pipeline(ctx context.Context, conn redis.Conn, cmds []txn.Cmd) ([]interface{}, error) {
	for _, c := range cmds {
		if err := conn.Send(c.Name, c.Args...); err != nil {
			return nil, err
		}
	}
	reps, err := redis.Values(do(ctx, conn, ""))
	if err != nil {
		return nil, err
	}
	if len(reps) != len(cmds) {
		return nil, fmt.Errorf("buckets: %d replies to %d commands", len(reps), len(cmds))
	}
	return reps, nil
}

// SetAside renames each of keys whose type is neither want nor "none" to
// its quarantine name ({ns}:bad:...), so that a key of the wrong type
// (written by hand, say) stops failing every command on it. Each key is
// one optimistic transaction: WATCH key; TYPE key; MULTI; RENAME; EXEC, so
// that a key that became right meanwhile (set aside by another process
// and created again with tasks in it) is never renamed. It returns the
// keys it renamed.
func (s *Store) SetAside(ctx context.Context, conn redis.Conn, want string, keys ...string) ([]string, error) {
	var moved []string
	for _, k := range keys {
		renamed := false
		_, err := s.runner.Run(ctx, conn, []string{k}, func(tx *txn.Tx) error {
			renamed = false
			t, err := redis.String(tx.Do("TYPE", k))
			if err != nil {
				return err
			}
			if t == "none" || t == "" || t == want {
				return nil
			}
			tx.Queue("RENAME", k, s.Keys.Quarantine(k))
			renamed = true
			return nil
		})
		if err != nil {
			return moved, fmt.Errorf("buckets: set aside %s: %w", k, err)
		}
		if renamed {
			moved = append(moved, k)
		}
	}
	return moved, nil
}

// IsWrongType reports whether err is the server's error reply for a
// command on a key of the wrong type ("WRONGTYPE …" since 2.8, "ERR
// Operation against a key holding the wrong kind of value" before). Other
// error replies (LOADING while a restarted server reads its data, say)
// pass, and are retried.
func IsWrongType(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	re, ok := err.(redis.Error)
	if !ok && !errors.As(err, &re) {
		return false
	}
	m := string(re)
	return strings.HasPrefix(m, "WRONGTYPE") || strings.Contains(m, "wrong kind of value")
}

// IsServerError reports whether err is an error reply of the server (a
// command that ran and failed, such as one on a key of the wrong type), as
// opposed to a failure of the connection.
func IsServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// run is runner.Run for transactions that place tasks (push ids into a
// ready list or a bucket, index a bucket): when EXEC ran but such a push
// failed on a key of the wrong type (written by hand, say, between the
// transaction's reads and its EXEC), the other commands have run (Redis
// has no rollback), so the tasks would be in no list. repairPlacement then
// sets the key aside and places them again, and run reports success.
//
// Repairs kept from earlier failures (PlaceAgain) are tried first.
func (s *Store) run(ctx context.Context, conn redis.Conn, watch []string, fn func(*txn.Tx) error) ([]interface{}, error) {
	s.placeKept(ctx, conn)
	reps, err := s.runner.Run(ctx, conn, watch, fn)
	if err != nil {
		if ok, rerr := s.repairPlacement(ctx, conn, reps, err); rerr != nil {
			return reps, fmt.Errorf("%w (repair: %w)", err, rerr)
		} else if ok {
			return reps, nil
		}
	}
	return reps, err
}

// placeKept applies the repairs the Store keeps (PlaceAgain), if any,
// before a transaction that places tasks; what fails is kept for the next.
func (s *Store) placeKept(ctx context.Context, conn redis.Conn) {
	if s.unplacedN.Load() > 0 {
		_, _ = s.PlaceAgain(ctx, conn)
	}
}

// placement reports whether c places tasks: a push into a ready list or a
// bucket, or a bucket's index entry. Wake-up tokens (n:, wake) and
// counters are not placement: a wake-up is also given by the next idle
// wait's timeout, and `engine check` recounts a counter.
func (s *Store) placement(c txn.Cmd) bool {
	key, _ := c.Args[0].(string)
	rest := strings.TrimPrefix(key, s.Keys.Prefix())
	switch c.Name {
	case "LPUSH", "RPUSH":
		return strings.HasPrefix(rest, "q:") || strings.HasPrefix(rest, "b:")
	case "ZADD":
		return key == s.Keys.Schedule()
	}
	return false
}

// workerArgs holds, boxed once, the keys that a claim's or a result's
// writes name for every task: worker w's pending set and in-flight list,
// and the counters of the last queue asked for. A batch of n tasks then
// builds and boxes each once instead of n times (every string passed as
// a command argument is boxed, an allocation of its own).
type workerArgs struct {
	keys              Keys
	w                 string
	pending, inflight interface{}
	q                 string
	stats             interface{}
}

func (s *Store) workerArgs(w string) *workerArgs { return &workerArgs{keys: s.Keys, w: w} }

// Pending is Keys.Pending(w), boxed.
func (a *workerArgs) Pending() interface{} {
	if a.pending == nil {
		a.pending = a.keys.Pending(a.w)
	}
	return a.pending
}

// Inflight is Keys.Inflight(w), boxed.
func (a *workerArgs) Inflight() interface{} {
	if a.inflight == nil {
		a.inflight = a.keys.Inflight(a.w)
	}
	return a.inflight
}

// Stats is Keys.Stats(q), boxed; it keeps the last queue's.
func (a *workerArgs) Stats(q string) interface{} {
	if a.stats == nil || a.q != q {
		a.q, a.stats = q, a.keys.Stats(q)
	}
	return a.stats
}
