package buckets

import (
	"fmt"
	"strconv"
	"strings"
)

// ValidName reports whether s may name a queue or a namespace: 1 to 64
// of A-Z, a-z, 0-9, '_', '.' and '-'. Names end up inside key names and
// index members, so they stay short and plain. (It is on every enqueue's
// and every move's path, so it is a loop rather than a regexp.)
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Keys formats every key of one namespace. All keys start with the
// namespace in a hash tag, "{ns}:", so that a Redis Cluster would keep a
// namespace in one slot (MULTI/EXEC needs all its keys on one node).
type Keys struct {
	prefix string
}

// NewKeys returns the key schema of namespace ns.
func NewKeys(ns string) (Keys, error) {
	if !ValidName(ns) {
		return Keys{}, fmt.Errorf("buckets: namespace %q: want 1-64 of A-Z a-z 0-9 _ . -: %w", ns, ErrInvalid)
	}
	return Keys{prefix: "{" + ns + "}:"}, nil
}

// Prefix is the common start of every key of the namespace.
func (k Keys) Prefix() string { return k.prefix }

// Task is the task record: STRING, the encoded [Record].
func (k Keys) Task(id string) string { return k.prefix + "t:" + id }

// Tasks returns the record keys of ids, in order.
func (k Keys) Tasks(ids []string) []string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = k.Task(id)
	}
	return keys
}

// Bucket is the bucket of queue q for timestamp ts (Unix ms): LIST of task
// ids, oldest first (RPUSH).
func (k Keys) Bucket(q string, ts int64) string {
	return k.prefix + "b:" + q + ":" + strconv.FormatInt(ts, 10)
}

// bucketOf is Bucket(q, ts) for the index member m that ParseMember split
// into q and ts: built from m itself, in one allocation, when m spells ts
// as Member does (digits only, no leading zero).
func (k Keys) bucketOf(m, q string, ts int64) string {
	if d := m[len(q)+1:]; d == "0" || d != "" && d[0] >= '1' && d[0] <= '9' {
		return k.prefix + "b:" + m
	}
	return k.Bucket(q, ts)
}

// Schedule is the bucket index: ZSET, member "queue:ts", score ts; or,
// for a task scheduled inline, member "queue:id" (InlineMember), score
// the task's bucket time.
func (k Keys) Schedule() string { return k.prefix + "sched" }

// RetryCounts counts the retries at the front of each bucket: HASH, field
// the bucket's index member, value how many of the bucket's first entries
// are tasks waiting for another attempt. A retry is pushed at a bucket's
// front (LPUSH) and counted here in the same MULTI, so a move that takes
// n entries from the front knows that min(n, count) of them are retries
// and moves them from the retrying gauge, the rest from the scheduled one.
func (k Keys) RetryCounts() string { return k.prefix + "rc" }

// Ready is queue q's ready list: LIST of task ids; producers LPUSH at the
// head, workers RPOPLPUSH from the tail, so it runs first in, first out.
// q is a place (Place): the list of one priority level of a queue.
func (k Keys) Ready(q string) string { return k.prefix + "q:" + q }

// MaxLevel is the lowest priority level: a task's level is 1 (the
// default, first to run) to MaxLevel.
const MaxLevel = 4

// levelSuffix is the suffix of a level's place, by level.
var levelSuffix = [MaxLevel + 1]string{"", "", "@2", "@3", "@4"}

// Place names where the tasks of queue q at priority level lvl wait: q
// itself for level 1 (and anything out of 2..MaxLevel), "q@<lvl>" for
// levels 2 to MaxLevel. A place stands for a queue name in the keys of
// the lists a task waits in (Ready, Bucket, Member, InlineMember); '@' is
// not allowed in queue names, so no queue is another's place. Keys.Stats
// and Keys.Notify map a place to its queue. A task with a key (a tenant,
// say: Record.Key) waits in its key's place, KeyPlace.
func Place(q string, lvl int) string {
	if lvl < 2 || lvl > MaxLevel {
		return q
	}
	return q + levelSuffix[lvl]
}

// KeyPlace is the place of the tasks of key key at place p (a queue's
// level): "p#key", a list of its own that the workers take round-robin
// with the level's other keys (Keys.Rotation). An empty key is p itself.
func KeyPlace(p, key string) string {
	if key == "" {
		return p
	}
	return p + "#" + key
}

// SplitKey returns the level's place and the key of a place: p and ""
// for a place without a key.
func SplitKey(place string) (p, key string) {
	if i := strings.IndexByte(place, '#'); i >= 0 {
		return place[:i], place[i+1:]
	}
	return place, ""
}

// SplitPlace returns the queue and the level of a place (Place, KeyPlace).
func SplitPlace(place string) (q string, lvl int) {
	place, _ = SplitKey(place)
	if n := len(place); n > 2 && place[n-2] == '@' && place[n-1] >= '2' && place[n-1] <= '0'+MaxLevel {
		return place[:n-2], int(place[n-1] - '0')
	}
	return place, 1
}

// QueueOf returns the queue of a place (Place).
func QueueOf(place string) string {
	q, _ := SplitPlace(place)
	return q
}

// validPlace reports whether s is a place of a valid queue name, and of a
// valid key if it names one.
func validPlace(s string) bool {
	p, key := SplitKey(s)
	return ValidName(QueueOf(p)) && (key == "" && len(p) == len(s) || ValidName(key))
}

// Notify is queue q's wake-up list: LIST of tokens pushed together with
// ready tasks, which idle workers wait on with BLPOP. Tokens carry no
// task; losing one costs at most one idle wait. q may be a place (Place):
// every level of a queue wakes its queue's waiters.
func (k Keys) Notify(q string) string { return k.prefix + "n:" + QueueOf(q) }

// Levels is the set of the places of priority levels above 1 that were
// ever made ready: SET of Place(q, level) names. Whatever pushes a task of
// level 2 to 4 to its ready list adds its place in the same MULTI; a
// worker reads the set (at most once a second while it finds a queue's
// level 1 empty, and after each wake) to learn which levels to pop. A
// queue that never used a level above 1 is not in it.
func (k Keys) Levels() string { return k.prefix + "levels" }

// Rotation is the rotation of the keys of place p (a queue's level): ZSET,
// member a key whose list (Ready(KeyPlace(p, key))) may hold tasks, score
// the earliest time (Unix ms) a worker may take from it: when it was last
// served, for a key in turn (least recently served first), or when its
// rate window opens. Whatever pushes a task to a key's list adds the key
// at 0 if absent (ZINCRBY 0: a key that arrives goes next, and one waiting
// for its window keeps its time); the pop that empties the list removes
// it, and so does a claim that finds every slot of the key in use, until
// the release of one puts it back (ZADD now). A place with keyed tasks is
// named in the levels set as "p#".
func (k Keys) Rotation(p string) string { return k.prefix + "kr:" + p }

// KeySlots is the set of the running tasks of queue q's key key that hold
// one of its slots (QueueConfig.KeyMaxRunning): SET of task ids, gone
// when empty. Its size is the key's slots in use.
func (k Keys) KeySlots(q, key string) string { return k.prefix + "ks:" + KeyPlace(q, key) }

// RateLog is the start log of a rate limit: LIST of the claim times (Unix
// ms) of the last starts, newest first, trimmed to the limit's count. name
// is a queue (its rate) or "q#key" (the key's rate, KeyPlace of the queue;
// with a TTL of its period and a second, renewed by every start, so that
// a key without starts costs nothing).
func (k Keys) RateLog(name string) string { return k.prefix + "rl:" + name }

// Wake is the dispatchers' wake-up list: LIST of due times (Unix ms),
// pushed with every scheduled task so a sleeping dispatcher re-reads the
// index when an earlier task arrives.
func (k Keys) Wake() string { return k.prefix + "wake" }

// Turn is the dispatch turn: STRING, the id of the dispatcher that holds
// it, with a TTL its holder renews (see TakeTurn).
func (k Keys) Turn() string { return k.prefix + "turn" }

// TurnMissed marks that a dispatcher was turned away while the turn was
// held: STRING "1", with a TTL (see EndTurn).
func (k Keys) TurnMissed() string { return k.prefix + "turn:missed" }

// Queues is the set of queue names ever enqueued to: SET.
func (k Keys) Queues() string { return k.prefix + "queues" }

// Stats holds queue q's counters: HASH, see the Stat* field names. q may
// be a place (Place): a level's tasks count in its queue's counters.
func (k Keys) Stats(q string) string { return k.prefix + "st:" + QueueOf(q) }

// Workers is the registry of worker processes: SET of process ids.
func (k Keys) Workers() string { return k.prefix + "w" }

// Heartbeat is worker process w's liveness key: STRING with a TTL,
// refreshed by SETEX; its disappearance means the process is dead.
func (k Keys) Heartbeat(w string) string { return k.prefix + "hb:" + w }

// Inflight is worker process w's in-flight list: LIST of ids taken by
// RPOPLPUSH and not yet claimed. It closes the window between taking a
// task and recording it as running.
func (k Keys) Inflight(w string) string { return k.prefix + "f:" + w }

// Pending is worker process w's pending set: ZSET of running task ids,
// scored by lease deadline (Unix ms on the worker's clock).
func (k Keys) Pending(w string) string { return k.prefix + "p:" + w }

// Dead is the dead-letter index: ZSET of task ids scored by when they died
// (Unix ms). The records stay under [Keys.Task].
func (k Keys) Dead() string { return k.prefix + "dead" }

// Unique is unique key k's holder: STRING, the id of the task that took
// it, with a TTL when it was taken with one. The key is held only while
// that task's record is waiting, retrying or running and names k.
func (k Keys) Unique(key string) string { return k.prefix + "u:" + key }

// Result is task id's result: STRING, kept for the result retention.
func (k Keys) Result(id string) string { return k.prefix + "r:" + id }

// Progress is task id's last reported progress: STRING, an encoded
// [Progress], with a TTL (SETEX) that outlives the run and its done
// record.
func (k Keys) Progress(id string) string { return k.prefix + "pg:" + id }

// Completion is task id's completion list: LIST of one element, the
// outcome of its final transition (see [EncodeOutcome]), which waiters
// block on with BRPOPLPUSH onto the same list; it expires on its own.
func (k Keys) Completion(id string) string { return k.prefix + "c:" + id }

// Waiter marks task id as waited for: STRING "1" with a TTL
// ([WaiterTTL]), set by every waiter before it blocks on the completion
// list; a success leaves the list out only while no mark is set.
func (k Keys) Waiter(id string) string { return k.prefix + "cw:" + id }

// Quarantine is where a key of the wrong type found in the namespace is
// renamed to, so that it stops blocking the keys around it: any type.
func (k Keys) Quarantine(orig string) string {
	return k.prefix + "bad:" + strings.TrimPrefix(orig, k.prefix)
}

// PeriodicEntry is periodic entry name's hash: HASH with the fields
// Entry* (definition, fingerprint, stamp, watermark, last claimed run).
func (k Keys) PeriodicEntry(name string) string { return k.prefix + "pe:" + name }

// Periodics is the set of the names of every periodic entry: SET.
func (k Keys) Periodics() string { return k.prefix + "periodic" }

// PeriodicDeclarers is the set of the scheduler ids that declared entry
// name: SET. A declarer is live while its [Keys.SchedulerAlive] key exists.
func (k Keys) PeriodicDeclarers(name string) string { return k.prefix + "pd:" + name }

// SchedulerAlive is scheduler id's liveness key: STRING with a TTL,
// refreshed by every scheduling pass (SETEX), so no clocks are compared.
func (k Keys) SchedulerAlive(id string) string { return k.prefix + "ps:" + id }

// Member is the index member of queue q's bucket at ts.
func Member(q string, ts int64) string { return q + ":" + strconv.FormatInt(ts, 10) }

// ParseMember splits an index member into queue and timestamp. The queue
// is a place (Place): a bucket of a level above 1 names its level.
func ParseMember(m string) (q string, ts int64, err error) {
	i := strings.LastIndexByte(m, ':')
	if i <= 0 {
		return "", 0, fmt.Errorf("buckets: index member %q: %w", m, ErrMalformed)
	}
	q = m[:i]
	ts, err = strconv.ParseInt(m[i+1:], 10, 64)
	if err != nil || !validPlace(q) || ts < 0 {
		return "", 0, fmt.Errorf("buckets: index member %q: %w", m, ErrMalformed)
	}
	return q, ts, nil
}

// Guards is how many inline guards a namespace has (Keys.Guard).
const Guards = 16

// Guard is inline guard i (0 ≤ i < Guards): STRING, a counter. Every
// transaction that removes an inline entry (InlineMember) from the index
// watches the entry's guard (GuardOf) before it reads the entry, and
// increments the guard in its MULTI: of two such transactions over one
// entry, at most one commits. An inline entry has no key of its own to
// watch, and watching the index would make every move conflict with
// every enqueue.
func (k Keys) Guard(i int) string { return k.prefix + "g:" + strconv.Itoa(i) }

// GuardOf is the guard of task id's inline entry: FNV-1a of the id,
// modulo Guards.
func GuardOf(id string) int {
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % Guards)
}

// InlineMember is the index member of task id of queue q scheduled inline:
// without a bucket list, the index naming the task itself ("q:id", scored
// with the task's bucket time). Only an Inlineable id is scheduled so.
func InlineMember(q, id string) string { return q + ":" + id }

// Inlineable reports whether task id may be scheduled inline: an id of the
// generated shape (IDTime: 22 base62 digits, perhaps a "~" suffix) without
// ':'. Such an id never parses as a bucket time (22 digits are more than an
// int64 holds), so ParseIndexMember tells its entry from a bucket's.
func Inlineable(id string) bool {
	if _, ok := IDTime(id); !ok {
		return false
	}
	return strings.IndexByte(id, ':') < 0
}

// InlinePlace names inline entry m as a place of its task in the
// namespace check's findings (Finding.Places): "{ns}:sched:" and the
// entry. No key has that name; the entry is a member of the index.
func (k Keys) InlinePlace(m string) string { return k.prefix + "sched:" + m }

// inlinePlaceID returns the task id of an InlinePlace.
func (k Keys) inlinePlaceID(place string) (string, bool) {
	m, ok := strings.CutPrefix(place, k.prefix+"sched:")
	if !ok {
		return "", false
	}
	return inlineEntry(m)
}

// ParseIndexMember splits an index member (its queue a place, see
// ParseMember): a bucket's into its queue and
// time (id empty), an inline entry's (InlineMember) into its queue and
// task id (ts 0: the entry's time is its score).
func ParseIndexMember(m string) (q string, ts int64, id string, err error) {
	if id, ok := inlineEntry(m); ok {
		if q = m[:len(m)-len(id)-1]; !validPlace(q) {
			return "", 0, "", fmt.Errorf("buckets: index member %q: %w", m, ErrMalformed)
		}
		return q, 0, id, nil
	}
	q, ts, err = ParseMember(m)
	return q, ts, "", err
}

// inlineEntry returns the task id of index member m when m is an inline
// entry, without checking its queue (ParseIndexMember does).
func inlineEntry(m string) (string, bool) {
	if i := strings.LastIndexByte(m, ':'); i > 0 && Inlineable(m[i+1:]) {
		return m[i+1:], true
	}
	return "", false
}

// BucketTime rounds a due time up to the bucket resolution: the bucket of a
// task is never earlier than the task, so moving a bucket when its time has
// come never makes a task ready early. Both are in milliseconds.
func BucketTime(due, resolution int64) int64 {
	if resolution <= 1 {
		return due
	}
	if due <= 0 {
		return 0
	}
	return (due + resolution - 1) / resolution * resolution
}

// Paused is the set of paused queues: SET of queue names. Workers take no
// task from a paused queue; dispatchers ignore it.
func (k Keys) Paused() string { return k.prefix + "paused" }

// Control is the namespace's control channel (pub/sub, not a key):
// messages "pause <q>" and "resume <q>". It carries no state: the paused
// set does.
func (k Keys) Control() string { return k.prefix + "ctl" }

// Served says that a live worker serves task type typ on queue q: STRING
// with a TTL, refreshed by the heartbeat of each such worker.
func (k Keys) Served(q, typ string) string { return k.prefix + "ty:" + q + ":" + typ }

// Unserved holds, for queue q, the types whose tasks a worker gave back
// while no live worker served them: HASH type → when that was first seen
// (Unix ms on the worker's clock). A serving worker's heartbeat removes
// its types.
func (k Keys) Unserved(q string) string { return k.prefix + "un:" + q }

// Limit holds queue q's concurrency limit: HASH, field
// [LimitMaxRunning] (at most that many tasks of q run at once, across
// every worker process; absent or 0: no limit).
func (k Keys) Limit(q string) string { return k.prefix + "lim:" + q }

// Slots counts the slots of queue q's concurrency limit in use: STRING,
// the number of running records of q that hold one (Record.HoldsSlot).
func (k Keys) Slots(q string) string { return k.prefix + "sl:" + q }

// SlotWake is queue q's slot wake-up list: LIST of tokens, one pushed
// each time a slot is given back, trimmed as the queues' wake-up lists
// are (queueTokens); a worker that found the queue full blocks on it.
func (k Keys) SlotWake(q string) string { return k.prefix + "sw:" + q }
