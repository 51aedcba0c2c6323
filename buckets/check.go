package buckets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// FindingKind names what is wrong in a [Finding].
type FindingKind string

// What the checker finds.
const (
	// FindGauge: a gauge of a queue's counters hash differs from what the
	// structures hold (Gauge, Stored, Counted).
	FindGauge FindingKind = "gauge"
	// FindHomeless: a record in none of the places its state needs (a
	// waiting or retrying task in no bucket, ready list or in-flight
	// list; a running task not in its worker's pending set; a dead
	// letter not in the dead-letter index). Nobody would ever run it.
	FindHomeless FindingKind = "homeless"
	// FindDuplicate: an id in two or more of the places its state allows.
	FindDuplicate FindingKind = "duplicate"
	// FindStray: an id in a place its record's state does not allow (a
	// running task's id in a ready list, say).
	FindStray FindingKind = "stray"
	// FindOrphanBucket: a bucket list that is not in the bucket index; no
	// dispatcher will ever move it.
	FindOrphanBucket FindingKind = "orphan-bucket"
	// FindStaleMember: an index member whose bucket list does not exist.
	FindStaleMember FindingKind = "stale-member"
	// FindBadMember: an index member that does not parse as queue:ts.
	FindBadMember FindingKind = "bad-member"
	// FindWrongType: a key of the schema that holds the wrong type.
	FindWrongType FindingKind = "wrong-type"
	// FindRetryCount: a bucket's retry count (Keys.RetryCounts) differs
	// from the number of retrying tasks in it (Member, Stored, Count).
	FindRetryCount FindingKind = "retry-count"
	// FindUnregistered: a worker that holds tasks (in-flight or pending)
	// but is not in the worker registry: no reaper would return its
	// tasks if it died (Worker, Key).
	FindUnregistered FindingKind = "unregistered-worker"
	// FindUnlistedLevel: the ready list of a priority level above 1
	// holds tasks, but the levels set (Keys.Levels) does not name its
	// place (Member): workers would not pop it (Queue, Key).
	FindUnlistedLevel FindingKind = "unlisted-level"
	// FindSlots: a queue's count of slots in use (Keys.Slots) differs
	// from the number of its running records that hold one (Stored,
	// Count).
	FindSlots FindingKind = "slots"
	// FindUnturnedKey: a key's ready list (Member, a KeyPlace) holds
	// tasks but its level's rotation (Keys.Rotation) lacks the key:
	// workers would not pop it (Queue, Key).
	FindUnturnedKey FindingKind = "unturned-key"
	// FindKeySlots: a key's slots in use (Keys.KeySlots, Key; the key is
	// Member) are not the running records of its key that hold one
	// (Stored, Count): a slot held by no run would hold the key back
	// for good.
	FindKeySlots FindingKind = "key-slots"
)

// Finding is one thing the checker found wrong.
type Finding struct {
	Kind   FindingKind
	Queue  string   // the queue concerned, when one is
	ID     string   // the task id (homeless, duplicate, stray)
	State  State    // the record's state (homeless, duplicate, stray)
	Key    string   // the key concerned (buckets, wrong types)
	Member string   // the index member (orphan, stale and bad members)
	Places []string // keys where the id was found
	Worker string   // the worker (unregistered workers)
	Gauge  string   // the gauge (a Stat* name)
	Stored int64    // the gauge's stored value
	Count  int64    // what the structures hold
}

// ident is what two walks must agree on for a finding to be confirmed.
func (f Finding) ident() string {
	return strings.Join([]string{string(f.Kind), f.Queue, f.ID, f.Key, f.Member, f.Gauge, f.Worker}, "\x00")
}

func (f Finding) String() string {
	switch f.Kind {
	case FindGauge:
		return fmt.Sprintf("queue %s: gauge %s is %d, the structures hold %d", f.Queue, f.Gauge, f.Stored, f.Count)
	case FindSlots:
		return fmt.Sprintf("queue %s: %d slots in use, %d running tasks hold one", f.Queue, f.Stored, f.Count)
	case FindRetryCount:
		return fmt.Sprintf("bucket %s: retry count is %d, the bucket holds %d retrying tasks", f.Member, f.Stored, f.Count)
	case FindHomeless:
		return fmt.Sprintf("task %s (%s, queue %s) is in none of the places its state needs", f.ID, f.State, f.Queue)
	case FindDuplicate:
		return fmt.Sprintf("task %s (%s, queue %s) is in %d places: %s", f.ID, f.State, f.Queue, len(f.Places), strings.Join(f.Places, ", "))
	case FindStray:
		return fmt.Sprintf("task %s (%s, queue %s) is where its state does not allow: %s", f.ID, f.State, f.Queue, strings.Join(f.Places, ", "))
	case FindOrphanBucket:
		return fmt.Sprintf("bucket %s is not in the bucket index (member %s missing)", f.Key, f.Member)
	case FindStaleMember:
		return fmt.Sprintf("index member %s names no bucket list", f.Member)
	case FindBadMember:
		return fmt.Sprintf("index member %q does not parse as queue:time", f.Member)
	case FindWrongType:
		return fmt.Sprintf("key %s holds the wrong type", f.Key)
	case FindUnregistered:
		return fmt.Sprintf("worker %s holds tasks in %s but is not registered: no reaper would return them", f.Worker, f.Key)
	case FindUnlistedLevel:
		return fmt.Sprintf("queue %s: %s holds tasks but the levels set does not name %s: no worker would pop it", f.Queue, f.Key, f.Member)
	case FindUnturnedKey:
		return fmt.Sprintf("queue %s: %s holds tasks but its key is not in turn: no worker would pop it", f.Queue, f.Key)
	case FindKeySlots:
		return fmt.Sprintf("queue %s: key %s holds %d slots, %d running tasks hold one", f.Queue, f.Member, f.Stored, f.Count)
	}
	return string(f.Kind)
}

// CheckOptions tunes CheckNamespace.
type CheckOptions struct {
	// ListKeys lists the namespace's task, bucket, in-flight and pending
	// keys with one KEYS {ns}:[tbfp]:* before walking the structures. It
	// is the only way, at Redis 2.4, to find records without a home and
	// buckets missing from the index. KEYS walks every key of the
	// database in one command, O(keys in the database), and blocks the
	// server meanwhile: on a large database run it off-peak.
	ListKeys bool
	// Page bounds the elements read by one command (LRANGE, ZRANGEBYSCORE,
	// MGET);
	// zero means 500.
	Page int
	// Attempts bounds the confirmation and repair transactions' attempts
	// (each a whole walk under WATCH); zero means 8.
	Attempts int
}

// CheckReport is what CheckNamespace found.
type CheckReport struct {
	// Findings were seen by a first walk and again by a second one that
	// no write to any key concerned interrupted: they are not moves in
	// progress.
	Findings []Finding
	// Unconfirmed were seen by the first walk, but the keys concerned
	// kept changing and the second walk could not settle them.
	Unconfirmed []Finding
	// InMotion counts the first walk's findings that the second walk
	// settled and did not find again: tasks that were moving.
	InMotion int
	// Tasks counts the distinct task ids seen; Queues the queues walked.
	Tasks, Queues int
}

// reader sends the checker's reads: on a plain connection, or inside a
// watched transaction so that EXEC can vouch that nothing changed.
type reader interface {
	do(name string, args ...interface{}) (interface{}, error)
	batch(cmds []txn.Cmd) ([]interface{}, error)
}

// connReader reads on a plain connection, each round trip bounded by ctx.
type connReader struct {
	ctx context.Context
	c   redis.Conn
}

func (r connReader) do(name string, args ...interface{}) (interface{}, error) {
	return do(r.ctx, r.c, name, args...)
}

func (r connReader) batch(cmds []txn.Cmd) ([]interface{}, error) {
	for _, c := range cmds {
		if err := r.c.Send(c.Name, c.Args...); err != nil {
			return nil, err
		}
	}
	reps, err := redis.Values(r.do(""))
	if err != nil {
		return nil, err
	}
	if len(reps) != len(cmds) {
		return nil, fmt.Errorf("%d replies to %d commands", len(reps), len(cmds))
	}
	return reps, nil
}

type txReader struct{ tx *txn.Tx }

func (r txReader) do(name string, args ...interface{}) (interface{}, error) {
	return r.tx.Do(name, args...)
}
func (r txReader) batch(cmds []txn.Cmd) ([]interface{}, error) {
	for _, c := range cmds {
		if err := r.tx.Send(c.Name, c.Args...); err != nil {
			return nil, err
		}
	}
	return r.tx.Flush()
}

// bucketInfo is one bucket key the walk knows of.
type bucketInfo struct {
	key, member, q string
	ts             int64
	indexed        bool
	length         int64
}

// walk is what one pass over the namespace read.
type walk struct {
	queues    map[string]bool
	workers   []string            // registered and listed
	unreg     map[string]bool     // listed, not registered
	dead      map[string]bool     // workers without a heartbeat
	buckets   []*bucketInfo       // by key order
	inline    map[string]int64    // queue -> its inline entries in the index
	places    map[string][]string // id -> keys holding it (InlinePlace for an inline entry)
	recs      map[string]*Record  // id -> decoded record (absent: missing or malformed)
	stored    map[string]map[string]int64
	slots     map[string]int64    // queue -> sl:<q> as read (absent: the key is)
	keySlots  map[string][]string // "q#key" -> the ids in ks:<q>#<key>
	heldKeys  map[string][]string // "q#key" -> the running records' ids that hold one of its slots
	listed    map[string]bool     // keyed ready lists found holding ids
	unturned  []string            // keyed places holding ids whose key is not in its rotation
	retries   map[string]int64    // the retry counts hash, by member
	noRetries bool                // it could not be read (wrong type)
	found     []Finding
}

func (w *walk) see(id, key string) {
	for _, k := range w.places[id] {
		if k == key {
			return // a page boundary moved under us: the same entry again
		}
	}
	w.places[id] = append(w.places[id], key)
}

func (s *Store) page(o CheckOptions) int {
	if o.Page <= 0 {
		return 500
	}
	return o.Page
}

// walkNamespace reads the structures, in the order tasks flow (buckets,
// ready lists, in-flight lists, pending sets, dead letters), so that the
// moves that change no record (a dispatcher's move, a worker's pop) can
// make an id appear twice but never nowhere.
func (s *Store) walkNamespace(r reader, o CheckOptions) (*walk, error) {
	w := &walk{queues: map[string]bool{}, dead: map[string]bool{}, unreg: map[string]bool{}, places: map[string][]string{}, inline: map[string]int64{},
		recs: map[string]*Record{}, stored: map[string]map[string]int64{}, slots: map[string]int64{},
		keySlots: map[string][]string{}, heldKeys: map[string][]string{}}
	n := s.page(o)
	k := s.Keys
	var listedIDs []string
	bucketAt := map[string]*bucketInfo{}
	addBucket := func(key, member, q string, ts int64, indexed bool) {
		if b := bucketAt[key]; b != nil {
			b.indexed = b.indexed || indexed
			return
		}
		b := &bucketInfo{key: key, member: member, q: q, ts: ts, indexed: indexed}
		bucketAt[key] = b
		w.buckets = append(w.buckets, b)
	}
	qs, err := redis.Strings(r.do("SMEMBERS", k.Queues()))
	if err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	for _, q := range qs {
		w.queues[q] = true
	}
	workers, err := redis.Strings(r.do("SMEMBERS", k.Workers()))
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	seenW := map[string]bool{}
	for _, x := range workers {
		seenW[x] = true
	}
	if o.ListKeys {
		keys, err := redis.Strings(r.do("KEYS", k.Prefix()+"[tbfp]:*"))
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		for _, key := range keys {
			rest := strings.TrimPrefix(key, k.Prefix())
			switch {
			case strings.HasPrefix(rest, "t:"):
				listedIDs = append(listedIDs, rest[2:])
			case strings.HasPrefix(rest, "b:"):
				if q, ts, err := ParseMember(rest[2:]); err == nil {
					addBucket(key, rest[2:], QueueOf(q), ts, false)
				}
			case strings.HasPrefix(rest, "f:"), strings.HasPrefix(rest, "p:"):
				if x := rest[2:]; !seenW[x] {
					seenW[x] = true
					w.unreg[x] = true
					workers = append(workers, x)
				}
			}
		}
	}
	sort.Strings(workers)
	w.workers = workers
	// The bucket index, a page at a time.
	err = walkByScore(r, k.Schedule(), n, func(m string) {
		q, ts, id, err := ParseIndexMember(m)
		if err != nil {
			w.found = append(w.found, Finding{Kind: FindBadMember, Member: m, Key: k.Schedule()})
			return
		}
		if id != "" {
			w.inline[QueueOf(q)]++
			w.queues[QueueOf(q)] = true
			w.see(id, k.InlinePlace(m))
			return
		}
		addBucket(k.Bucket(q, ts), m, QueueOf(q), ts, true)
	})
	if err != nil {
		return nil, fmt.Errorf("bucket index: %w", err)
	}
	sort.Slice(w.buckets, func(i, j int) bool { return w.buckets[i].key < w.buckets[j].key })
	// The retry counts: one field per bucket that ever held a retry,
	// removed with the bucket, so as small as the index.
	rc, err := redis.Int64Map(r.do("HGETALL", k.RetryCounts()))
	switch {
	case IsWrongType(err):
		w.found = append(w.found, Finding{Kind: FindWrongType, Key: k.RetryCounts()})
		w.noRetries = true
	case err != nil && !errors.Is(err, redis.ErrNil):
		return nil, fmt.Errorf("retry counts: %w", err)
	}
	w.retries = rc
	for _, b := range w.buckets {
		w.queues[b.q] = true
	}
	// Buckets: read from the tail, so that a dispatcher trimming the head
	// of a bucket it moves in part cannot make the walk skip entries.
	types, err := s.types(r, n, func(yield func(string)) {
		for _, b := range w.buckets {
			yield(b.key)
		}
	})
	if err != nil {
		return nil, err
	}
	for i, b := range w.buckets {
		switch types[i] {
		case "none":
			if b.indexed {
				w.found = append(w.found, Finding{Kind: FindStaleMember, Queue: b.q, Key: b.key, Member: b.member})
			}
			continue
		case "list":
		default:
			w.found = append(w.found, Finding{Kind: FindWrongType, Queue: b.q, Key: b.key})
			continue
		}
		ids, err := s.readList(r, b.key, n, true)
		if err != nil {
			return nil, err
		}
		b.length = int64(len(ids))
		for _, id := range ids {
			w.see(id, b.key)
		}
		if !b.indexed && len(ids) > 0 {
			w.found = append(w.found, Finding{Kind: FindOrphanBucket, Queue: b.q, Key: b.key, Member: b.member})
		}
	}
	// Ready lists, read from the head: producers push there, which can
	// only make the walk read an entry twice.
	// Every level's list of every queue, whatever the levels set says:
	// a task of a level the set lacks is found all the same.
	queues := sortedKeys(w.queues)
	places := make([]string, 0, MaxLevel*len(queues))
	for _, q := range queues {
		for lvl := 1; lvl <= MaxLevel; lvl++ {
			places = append(places, Place(q, lvl))
		}
	}
	if err := s.readLists(r, w, n, places, k.Ready); err != nil {
		return nil, err
	}
	if err := s.readLevels(r, w, places); err != nil {
		return nil, err
	}
	if err := s.readKeys(r, w, n); err != nil {
		return nil, err
	}
	if err := s.readLists(r, w, n, w.workers, k.Inflight); err != nil {
		return nil, err
	}
	// Heartbeats: whose in-flight lists a reaper may empty meanwhile.
	var hb cmdList
	for _, x := range w.workers {
		hb.Queue("EXISTS", k.Heartbeat(x))
	}
	if len(hb) > 0 {
		reps, err := r.batch(hb)
		if err != nil {
			return nil, fmt.Errorf("heartbeats: %w", err)
		}
		for i, rep := range reps {
			if v, _ := redis.Int(rep, nil); v == 0 {
				w.dead[w.workers[i]] = true
			}
		}
	}
	for _, x := range w.workers {
		if err := s.readZset(r, w, n, k.Pending(x)); err != nil {
			return nil, err
		}
	}
	if err := s.readZset(r, w, n, k.Dead()); err != nil {
		return nil, err
	}
	// Records of every id seen, and of every listed one.
	all := make([]string, 0, len(w.places)+len(listedIDs))
	for id := range w.places {
		all = append(all, id)
	}
	for _, id := range listedIDs {
		if _, ok := w.places[id]; !ok {
			all = append(all, id)
		}
	}
	sort.Strings(all)
	for i := 0; i < len(all); i += n {
		ids := all[i:min(i+n, len(all))]
		args := make([]interface{}, len(ids))
		for j, id := range ids {
			args[j] = k.Task(id)
		}
		raws, err := redis.Values(r.do("MGET", args...))
		if err != nil {
			return nil, fmt.Errorf("records: %w", err)
		}
		for j, raw := range raws {
			b, ok := raw.([]byte)
			if !ok {
				continue // gone: done and expired, or deleted
			}
			if rec, err := DecodeRecord(ids[j], b); err == nil {
				w.recs[ids[j]] = rec
				w.queues[rec.Queue] = true
			}
		}
	}
	// Stored gauges.
	queues = sortedKeys(w.queues)
	var hg cmdList
	for _, q := range queues {
		hg.Queue("HGETALL", k.Stats(q))
	}
	if len(hg) > 0 {
		reps, err := r.batch(hg)
		if err != nil {
			return nil, fmt.Errorf("counters: %w", err)
		}
		for i, rep := range reps {
			m, err := redis.Int64Map(rep, nil)
			if err != nil {
				w.found = append(w.found, Finding{Kind: FindWrongType, Queue: queues[i], Key: k.Stats(queues[i])})
				continue
			}
			w.stored[queues[i]] = m
		}
	}
	// Slots in use.
	if len(queues) > 0 {
		var gs cmdList
		for _, q := range queues {
			gs.Queue("GET", k.Slots(q))
		}
		reps, err := r.batch(gs)
		if err != nil {
			return nil, fmt.Errorf("slots: %w", err)
		}
		for i, rep := range reps {
			if rep == nil {
				continue
			}
			n, err := redis.Int64(rep, asError(rep))
			if err != nil {
				w.found = append(w.found, Finding{Kind: FindWrongType, Queue: queues[i], Key: k.Slots(queues[i])})
				continue
			}
			w.slots[queues[i]] = n
		}
	}
	w.judge(k, s.Resolution)
	return w, nil
}

// walkByScore calls each once for every member of the sorted set key, n
// members per read, paging by score: ZRANGEBYSCORE key <from> +inf
// WITHSCORES LIMIT <skip> n, where from is the last score read and skip
// is 0, so that the members at that score are read again and passed over.
// The engine removes members while the walk reads (a dispatcher the head
// of the bucket index, a reaper or a finish an id of a pending set, a
// retry or purge a dead letter); pages by rank (ZRANGE off off+n-1) would
// then shift under the walk and skip members it has not reached. Pages by
// score do not: a removal can only take a member the walk already read,
// or one it is still to read, which it then rightly does not see. Only
// when a whole page holds one score does the walk go on within it by rank
// (skip), as a listing of one time does.
func walkByScore(r reader, key string, n int, each func(member string)) error {
	seen := map[string]bool{}
	from, skip := "-inf", 0
	for {
		vs, err := redis.Strings(r.do("ZRANGEBYSCORE", key, from, "+inf", "WITHSCORES", "LIMIT", skip, n))
		if err != nil {
			return err
		}
		if len(vs)%2 != 0 {
			return fmt.Errorf("%d replies to a read WITHSCORES", len(vs))
		}
		for i := 0; i < len(vs); i += 2 {
			if !seen[vs[i]] {
				seen[vs[i]] = true
				each(vs[i])
			}
		}
		if len(vs) < 2*n {
			return nil
		}
		last := vs[len(vs)-1]
		switch {
		case last == vs[1] && last == from:
			skip += n // a whole page at one score, and not the first
		case last == vs[1]:
			from, skip = last, n // the first page at this score
		default:
			from, skip = last, 0
		}
	}
}

// types reads the TYPE of each key, a page per round trip.
func (s *Store) types(r reader, n int, each func(func(string))) ([]string, error) {
	var keys []string
	each(func(k string) { keys = append(keys, k) })
	out := make([]string, 0, len(keys))
	for i := 0; i < len(keys); i += n {
		var cmds cmdList
		for _, k := range keys[i:min(i+n, len(keys))] {
			cmds.Queue("TYPE", k)
		}
		reps, err := r.batch(cmds)
		if err != nil {
			return nil, fmt.Errorf("key types: %w", err)
		}
		for _, rep := range reps {
			t, _ := redis.String(rep, nil)
			out = append(out, t)
		}
	}
	return out, nil
}

// readList reads a whole list, n entries per round trip, from the head or
// from the tail. A key of the wrong type reads as an error reply.
func (s *Store) readList(r reader, key string, n int, fromTail bool) ([]string, error) {
	var out []string
	for off := 0; ; off += n {
		start, stop := off, off+n-1
		if fromTail {
			start, stop = -(off + n), -(off + 1)
		}
		ids, err := redis.Strings(r.do("LRANGE", key, start, stop))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", key, err)
		}
		if fromTail {
			out = append(ids, out...)
		} else {
			out = append(out, ids...)
		}
		if len(ids) < n {
			return out, nil
		}
	}
}

// readLists reads the list named by key(x) for each x; a key of the
// wrong type is a finding, not a failure of the walk.
func (s *Store) readLists(r reader, w *walk, n int, xs []string, key func(string) string) error {
	types, err := s.types(r, n, func(yield func(string)) {
		for _, x := range xs {
			yield(key(x))
		}
	})
	if err != nil {
		return err
	}
	for i, x := range xs {
		switch types[i] {
		case "none":
			continue
		case "list":
		default:
			w.found = append(w.found, Finding{Kind: FindWrongType, Key: key(x)})
			continue
		}
		ids, err := s.readList(r, key(x), n, false)
		if err != nil {
			return err
		}
		for _, id := range ids {
			w.see(id, key(x))
		}
	}
	return nil
}

// readLevels reads the levels set and reports each place of a level
// above 1 whose ready list the walk found holding ids (places are the
// ready lists walked) but the set does not name.
func (s *Store) readLevels(r reader, w *walk, places []string) error {
	k := s.Keys
	listed, err := redis.Strings(r.do("SMEMBERS", k.Levels()))
	switch {
	case IsWrongType(err):
		w.found = append(w.found, Finding{Kind: FindWrongType, Key: k.Levels()})
		return nil
	case err != nil:
		return fmt.Errorf("levels: %w", err)
	}
	named := map[string]bool{}
	for _, p := range listed {
		named[p] = true
	}
	held := map[string]bool{}
	for _, keys := range w.places {
		for _, key := range keys {
			held[key] = true
		}
	}
	for _, p := range places {
		if q, lvl := SplitPlace(p); lvl > 1 && !named[p] && held[k.Ready(p)] {
			w.found = append(w.found, Finding{Kind: FindUnlistedLevel, Queue: q, Key: k.Ready(p), Member: p})
		}
	}
	return nil
}

// readZset reads a sorted set's members, n per round trip (walkByScore).
func (s *Store) readZset(r reader, w *walk, n int, key string) error {
	t, err := redis.String(r.do("TYPE", key))
	if err != nil {
		return fmt.Errorf("type of %s: %w", key, err)
	}
	switch t {
	case "none":
		return nil
	case "zset":
	default:
		w.found = append(w.found, Finding{Kind: FindWrongType, Key: key})
		return nil
	}
	if err := walkByScore(r, key, n, func(id string) { w.see(id, key) }); err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	return nil
}

// judge turns what was read into findings: where each record is against
// where its state says it must be, and each gauge against a recount.
func (w *walk) judge(k Keys, resolution int64) {
	counted := map[string]map[string]int64{}
	count := func(q, g string, n int64) {
		if q == "" {
			// A dead letter of no queue (its record was missing or
			// unreadable where only the id was known): no gauge counts it.
			return
		}
		if counted[q] == nil {
			counted[q] = map[string]int64{}
		}
		counted[q][g] += n
	}
	for _, b := range w.buckets {
		count(b.q, StatScheduled, b.length)
	}
	for q, n := range w.inline {
		count(q, StatScheduled, n)
	}
	retryIn := map[string]int64{} // bucket key -> retrying tasks in it
	ids := make([]string, 0, len(w.recs))
	for id := range w.recs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	inflight := k.Prefix() + "f:"
	heldSlots := map[string]int64{}
	for _, id := range ids {
		r := w.recs[id]
		var good, bad []string
		need := true
		var allowed func(key string) bool
		switch r.State {
		case StateWaiting, StateRetry:
			bucketPrefix := k.Prefix() + "b:" + r.Place() + ":"
			if r.State == StateRetry {
				// Retrying while in a bucket; a due retry in a ready or
				// in-flight list is just ready.
				for _, key := range w.places[id] {
					if strings.HasPrefix(key, bucketPrefix) {
						count(r.Queue, StatRetrying, 1)
						count(r.Queue, StatScheduled, -1)
						retryIn[key]++
						break
					}
				}
			}
			entry := ""
			if r.State == StateWaiting {
				entry = k.InlinePlace(InlineMember(r.Place(), id)) // never a retry's
			}
			allowed = func(key string) bool {
				return key == k.Ready(r.Place()) || strings.HasPrefix(key, inflight) || strings.HasPrefix(key, bucketPrefix) || key == entry
			}
		case StateRunning:
			count(r.Queue, StatRunning, 1)
			if r.HoldsSlot {
				heldSlots[r.Queue]++
			}
			if r.HoldsKeySlot {
				name := KeyPlace(r.Queue, r.Key)
				w.heldKeys[name] = append(w.heldKeys[name], id)
			}
			allowed = func(key string) bool { return key == k.Pending(r.Worker) }
		case StateDead:
			count(r.Queue, StatDead, 1)
			allowed = func(key string) bool { return key == k.Dead() }
		default:
			// Done or cancelled: a worker that popped the id just before
			// it was cancelled still has it in its in-flight list, and its
			// claim drops it.
			need = false
			allowed = func(key string) bool { return strings.HasPrefix(key, inflight) }
		}
		for _, key := range w.places[id] {
			if allowed(key) {
				good = append(good, key)
			} else {
				bad = append(bad, key)
			}
		}
		f := Finding{ID: id, Queue: r.Queue, State: r.State}
		switch {
		case len(bad) > 0:
			f.Kind, f.Places = FindStray, w.places[id]
		case len(good) > 1:
			f.Kind, f.Places = FindDuplicate, good
		case need && len(good) == 0:
			f.Kind = FindHomeless
		default:
			continue
		}
		w.found = append(w.found, f)
	}
	indexed := map[string]bool{}
	for _, b := range w.buckets {
		if !b.indexed || w.noRetries {
			continue
		}
		indexed[b.member] = true
		if n := retryIn[b.key]; n != w.retries[b.member] {
			w.found = append(w.found, Finding{Kind: FindRetryCount, Queue: b.q, Key: b.key, Member: b.member, Stored: w.retries[b.member], Count: n})
		}
	}
	for _, m := range sortedKeys(w.retries) {
		if !indexed[m] {
			// The field of a bucket no longer in the index.
			w.found = append(w.found, Finding{Kind: FindRetryCount, Key: k.RetryCounts(), Member: m, Stored: w.retries[m]})
		}
	}
	held := map[string]string{}
	for _, list := range w.places {
		for _, key := range list {
			if x, ok := strings.CutPrefix(key, inflight); ok && w.unreg[x] {
				held[x] = key
			} else if x, ok := strings.CutPrefix(key, k.Prefix()+"p:"); ok && w.unreg[x] {
				held[x] = key
			}
		}
	}
	for _, x := range sortedKeys(held) {
		w.found = append(w.found, Finding{Kind: FindUnregistered, Worker: x, Key: held[x]})
	}
	for _, q := range sortedKeys(w.queues) {
		if q == "" {
			continue
		}
		st, ok := w.stored[q]
		if !ok && w.hasWrongType(k.Stats(q)) {
			continue
		}
		for _, g := range []string{StatScheduled, StatRetrying, StatRunning, StatDead} {
			if st[g] != counted[q][g] {
				w.found = append(w.found, Finding{Kind: FindGauge, Queue: q, Key: k.Stats(q), Gauge: g, Stored: st[g], Count: counted[q][g]})
			}
		}
	}
	for _, q := range sortedKeys(w.queues) {
		if q == "" || w.hasWrongType(k.Slots(q)) {
			continue
		}
		if w.slots[q] != heldSlots[q] {
			w.found = append(w.found, Finding{Kind: FindSlots, Queue: q, Key: k.Slots(q), Stored: w.slots[q], Count: heldSlots[q]})
		}
	}
	names := map[string]bool{}
	for name := range w.keySlots {
		names[name] = true
	}
	for name := range w.heldKeys {
		names[name] = true
	}
	for _, kp := range w.unturned {
		// A key out of turn while a running task holds one of its slots
		// is full: the release of the slot puts it back.
		p, key := SplitKey(kp)
		if q := QueueOf(p); len(w.heldKeys[KeyPlace(q, key)]) == 0 {
			w.found = append(w.found, Finding{Kind: FindUnturnedKey, Queue: q, Key: k.Ready(kp), Member: kp})
		}
	}
	for _, name := range sortedKeys(names) {
		q, key := SplitKey(name)
		set, held := w.keySlots[name], w.heldKeys[name]
		sort.Strings(set)
		sort.Strings(held)
		if !slices.Equal(set, held) && !w.hasWrongType(k.KeySlots(q, key)) {
			w.found = append(w.found, Finding{Kind: FindKeySlots, Queue: q, Key: k.KeySlots(q, key), Member: key, Stored: int64(len(set)), Count: int64(len(held))})
		}
	}
}

// readKeys reads the keyed ready lists (KeyPlace), found by name (one
// KEYS {ns}:q:*#*: keys are unbounded in number), and the key slot sets,
// and reports each list that holds tasks while its key, no slot of which
// is in use, is not in its level's rotation.
func (s *Store) readKeys(r reader, w *walk, n int) error {
	k := s.Keys
	lists, err := redis.Strings(r.do("KEYS", k.Prefix()+"q:*#*"))
	if err != nil {
		return fmt.Errorf("keyed lists: %w", err)
	}
	var kps []string
	for _, key := range lists {
		if kp := strings.TrimPrefix(key, k.Prefix()+"q:"); validPlace(kp) {
			kps = append(kps, kp)
		}
	}
	sort.Strings(kps)
	if err := s.readLists(r, w, n, kps, k.Ready); err != nil {
		return err
	}
	held := map[string]bool{}
	for _, keys := range w.places {
		for _, key := range keys {
			held[key] = true
		}
	}
	w.listed = held
	if err := s.readKeySlots(r, w); err != nil {
		return err
	}
	var zs cmdList
	var asked []string
	for _, kp := range kps {
		if held[k.Ready(kp)] {
			p, key := SplitKey(kp)
			zs.Queue("ZSCORE", k.Rotation(p), key)
			asked = append(asked, kp)
		}
	}
	if len(asked) > 0 {
		reps, err := r.batch(zs)
		if err != nil {
			return fmt.Errorf("rotations: %w", err)
		}
		for i, rep := range reps {
			p, _ := SplitKey(asked[i])
			if e, ok := rep.(redis.Error); ok && IsWrongType(e) {
				w.found = append(w.found, Finding{Kind: FindWrongType, Key: k.Rotation(p)})
			} else if rep == nil {
				w.unturned = append(w.unturned, asked[i]) // judged with the running records
			}
		}
	}
	return nil
}

// readKeySlots reads the key slot sets, found by name (one KEYS
// {ns}:ks:*).
func (s *Store) readKeySlots(r reader, w *walk) error {
	k := s.Keys
	sets, err := redis.Strings(r.do("KEYS", k.Prefix()+"ks:*"))
	if err != nil {
		return fmt.Errorf("key slots: %w", err)
	}
	sort.Strings(sets)
	var sm cmdList
	var names []string
	for _, key := range sets {
		name := strings.TrimPrefix(key, k.Prefix()+"ks:")
		if q, kk := SplitKey(name); ValidName(q) && ValidName(kk) {
			sm.Queue("SMEMBERS", key)
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	reps, err := r.batch(sm)
	if err != nil {
		return fmt.Errorf("key slots: %w", err)
	}
	for i, rep := range reps {
		ids, err := redis.Strings(rep, asError(rep))
		if err != nil {
			q, kk := SplitKey(names[i])
			w.found = append(w.found, Finding{Kind: FindWrongType, Key: k.KeySlots(q, kk)})
			continue
		}
		w.keySlots[names[i]] = ids
	}
	return nil
}

func (w *walk) hasWrongType(key string) bool {
	for _, f := range w.found {
		if f.Kind == FindWrongType && f.Key == key {
			return true
		}
	}
	return false
}

// watchFor lists the keys whose change would explain away finding f: the
// record and every place of a task, a queue's counters (which every
// transaction that moves its gauges changes), a bucket and the index.
func (s *Store) watchFor(f Finding) []string {
	k := s.Keys
	switch f.Kind {
	case FindGauge:
		keys := []string{k.Stats(f.Queue)}
		if f.Gauge == StatDead {
			keys = append(keys, k.Dead())
		}
		return keys
	case FindHomeless, FindDuplicate, FindStray:
		keys := []string{k.Task(f.ID)}
		for _, p := range f.Places {
			if _, ok := k.inlinePlaceID(p); ok {
				// Whoever removes an inline entry bumps its guard.
				p = k.Guard(GuardOf(f.ID))
			}
			keys = append(keys, p)
		}
		if f.Kind == FindHomeless {
			for lvl := 1; lvl <= MaxLevel; lvl++ {
				keys = append(keys, k.Ready(Place(f.Queue, lvl)))
			}
		}
		return keys
	case FindOrphanBucket, FindStaleMember:
		// Whoever fills or moves a bucket writes its list.
		return []string{f.Key}
	case FindBadMember:
		return []string{k.Schedule()}
	case FindRetryCount:
		return []string{f.Key, k.RetryCounts()}
	case FindSlots:
		// Every claim that takes a slot and every release writes it.
		return []string{k.Slots(f.Queue)}
	case FindUnregistered:
		return []string{k.Workers(), k.Inflight(f.Worker), k.Pending(f.Worker)}
	case FindUnlistedLevel:
		return []string{k.Levels(), f.Key}
	case FindUnturnedKey:
		p, _ := SplitKey(f.Member)
		return []string{k.Rotation(p), f.Key}
	default:
		return []string{f.Key}
	}
}

// CheckNamespace walks the namespace and reports what is inconsistent:
// gauges that differ from a recount of the structures, ids in no place or
// in two, orphan buckets and bad index members (see [FindingKind]). It
// uses only reads, each bounded to o.Page elements, except the one KEYS of
// o.ListKeys.
//
// A live system moves tasks while the walk reads, so a first walk's
// findings are only candidates. A second walk runs with the keys of every
// candidate WATCHed (its record, the places it was seen, the queue's
// counters, the in-flight lists of workers without a heartbeat, which a
// reaper may empty) and ends with an EXEC of one read: when EXEC answers,
// none of those keys changed during the second walk, and a candidate that
// it finds again is reported. When EXEC keeps failing, the candidates are
// returned as Unconfirmed.
func (s *Store) CheckNamespace(ctx context.Context, conn redis.Conn, o CheckOptions) (*CheckReport, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	first, err := s.walkNamespace(connReader{ctx, conn}, o)
	if err != nil {
		return nil, fmt.Errorf("buckets: check: %w", err)
	}
	rep := &CheckReport{Tasks: len(first.recs), Queues: len(first.queues)}
	if len(first.found) == 0 {
		return rep, nil
	}
	confirmed, err := s.confirm(ctx, conn, o, first)
	if errors.Is(err, txn.ErrConflict) {
		rep.Unconfirmed = first.found
		return rep, nil
	}
	if err != nil {
		return nil, fmt.Errorf("buckets: check: %w", err)
	}
	rep.Findings = confirmed
	rep.InMotion = len(first.found) - len(confirmed)
	return rep, nil
}

// checkRunner runs the checker's transactions: each attempt is a whole
// walk, so there are few of them, further apart than the engine's.
func (s *Store) checkRunner(o CheckOptions) *txn.Runner {
	n := o.Attempts
	if n <= 0 {
		n = 8
	}
	return &txn.Runner{MaxAttempts: n, MinBackoff: 5 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Fence: s.runner.Fence} // a repair is a write like any other (lanes.go)
}

// confirm walks again under WATCH and keeps the findings both walks made.
func (s *Store) confirm(ctx context.Context, conn redis.Conn, o CheckOptions, first *walk) ([]Finding, error) {
	var keys []string
	seen := map[string]bool{}
	add := func(ks ...string) {
		for _, k := range ks {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	for _, f := range first.found {
		add(s.watchFor(f)...)
	}
	for _, x := range first.workers {
		if first.dead[x] {
			add(s.Keys.Inflight(x))
		}
	}
	want := map[string]bool{}
	for _, f := range first.found {
		want[f.ident()] = true
	}
	var out []Finding
	_, err := s.checkRunner(o).Run(ctx, conn, keys, func(tx *txn.Tx) error {
		out = nil
		second, err := s.walkNamespace(txReader{tx}, o)
		if err != nil {
			return err
		}
		for _, f := range second.found {
			if want[f.ident()] {
				out = append(out, f)
			}
		}
		// Something for EXEC to answer, which it does only if no watched
		// key changed.
		tx.Queue("EXISTS", keys[0])
		return nil
	})
	return out, err
}

// Repair fixes what a confirmed finding says, in one optimistic
// transaction that reads again what the finding depends on. It reports
// whether it wrote anything; kinds it cannot repair (duplicates, strays,
// keys of the wrong type) return false. now (Unix ms) stamps wake-ups.
//
//	orphan bucket:  WATCH b:<q>:<ts>; read TYPE, LLEN, ZSCORE sched member;
//	                queue ZADD sched ts member + a dispatcher wake-up.
//	stale member:   WATCH b:<q>:<ts>; read EXISTS, ZSCORE; queue ZREM sched member.
//	bad member:     WATCH sched; read ZSCORE; queue ZREM sched member.
//	homeless task:  WATCH t:<id> and the places of its state (the guard
//	                of its inline entry too); read GET t:<id> and those
//	                places; queue, for a waiting or
//	                retrying task, its bucket (+ HINCRBY scheduled) or the
//	                front of its ready list; for a running one ZADD p:<w>
//	                deadline id + SADD w <w> (its worker finishes it, or the
//	                reaper returns it); for a dead letter ZADD dead.
//	unregistered:   WATCH w, f:<w>, p:<w>; read SISMEMBER, LLEN, ZCARD;
//	                queue SADD w <w> (a reaper then judges it like any other).
//	retry count:    WATCH the bucket, rc; read ZSCORE sched member, LRANGE
//	                the bucket, GET each id's record; queue HSET rc member
//	                n (the retrying records in it), or HDEL when n is 0 or
//	                the bucket is not in the index.
//	gauge:          WATCH st:<q> (and dead, f:<w> of workers without a
//	                heartbeat); a whole walk; queue HSET st:<q> gauge count
//	                for each gauge that differs.
//	slots:          WATCH sl:<q>; a whole walk; queue SET sl:<q> count
//	                (DEL when 0), and a wake-up token (LPUSH sw:<q> 1;
//	                LTRIM sw:<q> 0 63) when slots were freed.
//
// A crash before EXEC writes nothing; EXEC writes all of it. A change to a
// watched key makes EXEC fail and the repair read again.
func (s *Store) Repair(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding, now int64) (bool, error) {
	var (
		wrote bool
		err   error
	)
	switch f.Kind {
	case FindOrphanBucket, FindStaleMember, FindBadMember:
		wrote, err = s.repairMember(ctx, conn, o, f, now)
	case FindHomeless:
		wrote, err = s.repairHomeless(ctx, conn, o, f, now)
	case FindGauge:
		wrote, err = s.repairGauges(ctx, conn, o, f.Queue)
	case FindSlots:
		wrote, err = s.repairSlots(ctx, conn, o, f.Queue)
	case FindKeySlots:
		wrote, err = s.repairKeySlots(ctx, conn, o, f, now)
	case FindUnturnedKey:
		// Adding a key in turn is what every push does: no watch needed.
		p, key := SplitKey(f.Member)
		var rep interface{}
		if rep, err = do(ctx, conn, "ZINCRBY", s.Keys.Rotation(p), 0, key); err == nil {
			wrote = rep != nil
		}
	case FindUnregistered:
		wrote, err = s.repairUnregistered(ctx, conn, o, f)
	case FindUnlistedLevel:
		var added int
		if added, err = redis.Int(do(ctx, conn, "SADD", s.Keys.Levels(), f.Member)); err == nil {
			wrote = added == 1
		}
	case FindRetryCount:
		wrote, err = s.repairRetryCount(ctx, conn, o, f)
	default:
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("buckets: repair %s: %w", f, err)
	}
	return wrote, nil
}

func (s *Store) repairMember(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding, now int64) (bool, error) {
	wrote := false
	watch := []string{s.Keys.Schedule()}
	if f.Kind != FindBadMember {
		watch = []string{f.Key}
	}
	_, err := s.checkRunner(o).Run(ctx, conn, watch, func(tx *txn.Tx) error {
		wrote = false
		score, err := tx.Do("ZSCORE", s.Keys.Schedule(), f.Member)
		if err != nil {
			return err
		}
		switch f.Kind {
		case FindBadMember, FindStaleMember:
			if score == nil {
				return nil
			}
			if f.Kind == FindStaleMember {
				n, err := redis.Int(tx.Do("EXISTS", f.Key))
				if err != nil || n == 1 {
					return err
				}
			}
			tx.Queue("ZREM", s.Keys.Schedule(), f.Member)
		case FindOrphanBucket:
			q, ts, err := ParseMember(f.Member)
			if err != nil || score != nil {
				return err
			}
			n, err := redis.Int(tx.Do("LLEN", f.Key))
			if err != nil || n == 0 {
				return err
			}
			tx.Queue("ZADD", s.Keys.Schedule(), ts, Member(q, ts))
			s.wakeDispatchers(tx, ts)
		}
		wrote = true
		return nil
	})
	return wrote, err
}

func (s *Store) repairHomeless(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding, now int64) (bool, error) {
	k := s.Keys
	workers, err := redis.Strings(do(ctx, conn, "SMEMBERS", k.Workers()))
	if err != nil {
		return false, err
	}
	watch := []string{k.Task(f.ID), k.Workers()}
	for lvl := 1; lvl <= MaxLevel; lvl++ {
		watch = append(watch, k.Ready(Place(f.Queue, lvl)))
	}
	for _, x := range workers {
		watch = append(watch, k.Inflight(x))
	}
	wrote := false
	n := s.page(o)
	_, err = s.checkRunner(o).Run(ctx, conn, watch, func(tx *txn.Tx) error {
		wrote = false
		r, err := s.getRecord(tx, f.ID)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrMalformed) {
			return nil // gone, or the claim will bury it
		}
		if err != nil {
			return err
		}
		rd := txReader{tx}
		has := func(ids []string) bool {
			for _, id := range ids {
				if id == f.ID {
					return true
				}
			}
			return false
		}
		switch r.State {
		case StateWaiting, StateRetry:
			if in, err := s.inInlineEntry(tx, r); err != nil || in {
				return err // in its inline entry: that is its home
			}
			bucket := k.Bucket(r.Place(), BucketTime(r.Due, s.Resolution))
			if err := tx.Watch(bucket); err != nil {
				return err
			}
			for _, key := range append([]string{bucket, k.Ready(r.Place())}, inflights(k, workers)...) {
				if t, err := redis.String(tx.Do("TYPE", key)); err != nil || t != "list" {
					if err != nil {
						return err
					}
					continue
				}
				ids, err := s.readList(rd, key, n, key == bucket)
				if err != nil {
					return err
				}
				if has(ids) {
					return nil // it has a home after all
				}
			}
			s.place(tx, r, now, true)
		case StateRunning:
			score, err := tx.Do("ZSCORE", k.Pending(r.Worker), f.ID)
			if err != nil || score != nil {
				return err
			}
			tx.Queue("ZADD", k.Pending(r.Worker), r.Deadline, f.ID)
			tx.Queue("SADD", k.Workers(), r.Worker)
		case StateDead:
			score, err := tx.Do("ZSCORE", k.Dead(), f.ID)
			if err != nil || score != nil {
				return err
			}
			tx.Queue("ZADD", k.Dead(), max(r.Finished, 1), f.ID)
		default:
			return nil
		}
		wrote = true
		return nil
	})
	return wrote, err
}

func inflights(k Keys, workers []string) []string {
	out := make([]string, len(workers))
	for i, x := range workers {
		out[i] = k.Inflight(x)
	}
	return out
}

func (s *Store) repairGauges(ctx context.Context, conn redis.Conn, o CheckOptions, q string) (bool, error) {
	k := s.Keys
	workers, err := redis.Strings(do(ctx, conn, "SMEMBERS", k.Workers()))
	if err != nil {
		return false, err
	}
	watch := []string{k.Stats(q), k.Dead(), k.Workers()}
	for _, x := range workers {
		if n, err := redis.Int(do(ctx, conn, "EXISTS", k.Heartbeat(x))); err == nil && n == 0 {
			watch = append(watch, k.Inflight(x))
		}
	}
	return s.repairWalked(ctx, conn, o, watch, func(tx *txn.Tx, w *walk) bool {
		args := []interface{}{k.Stats(q)}
		for _, f := range w.found {
			if f.Kind == FindGauge && f.Queue == q {
				args = append(args, f.Gauge, strconv.FormatInt(f.Count, 10))
			}
		}
		if len(args) == 1 {
			return false
		}
		tx.Queue("HMSET", args...)
		return true
	})
}

// repairWalked runs a repair as one optimistic transaction: it watches
// watch, walks the namespace again inside the transaction, so that what
// it writes is judged on what EXEC changes, and queues fix's writes (fix
// reports whether it queued any). A change to a watched key makes EXEC
// fail and the walk run again.
func (s *Store) repairWalked(ctx context.Context, conn redis.Conn, o CheckOptions, watch []string, fix func(tx *txn.Tx, w *walk) bool) (bool, error) {
	wrote := false
	_, err := s.checkRunner(o).Run(ctx, conn, watch, func(tx *txn.Tx) error {
		wrote = false
		w, err := s.walkNamespace(txReader{tx}, o)
		if err != nil {
			return err
		}
		wrote = fix(tx, w)
		return nil
	})
	return wrote, err
}

func (s *Store) repairSlots(ctx context.Context, conn redis.Conn, o CheckOptions, q string) (bool, error) {
	k := s.Keys
	return s.repairWalked(ctx, conn, o, []string{k.Slots(q)}, func(tx *txn.Tx, w *walk) bool {
		wrote := false
		for _, f := range w.found {
			if f.Kind != FindSlots || f.Queue != q {
				continue
			}
			if f.Count == 0 {
				tx.Queue("DEL", k.Slots(q))
			} else {
				tx.Queue("SET", k.Slots(q), strconv.FormatInt(f.Count, 10))
			}
			if f.Count < f.Stored {
				s.queueTokens(tx, k.SlotWake(q), 1, "1")
			}
			wrote = true
		}
		return wrote
	})
}

// repairKeySlots sets a key's slot set to the running records that hold
// one, under WATCH of the set and a second walk inside the transaction
// (repairWalked), and puts the key in turn at once when slots were
// freed.
func (s *Store) repairKeySlots(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding, now int64) (bool, error) {
	k := s.Keys
	return s.repairWalked(ctx, conn, o, []string{f.Key}, func(tx *txn.Tx, w *walk) bool {
		wrote := false
		for _, g := range w.found {
			if g.Kind != FindKeySlots || g.Key != f.Key {
				continue
			}
			held := w.heldKeys[KeyPlace(g.Queue, g.Member)]
			tx.Queue("DEL", f.Key)
			if len(held) > 0 {
				args := []interface{}{f.Key}
				for _, id := range held {
					args = append(args, id)
				}
				tx.Queue("SADD", args...)
			}
			if g.Count < g.Stored {
				// Slots freed: the key's lists that hold tasks, at any
				// level, come in turn at once.
				for lvl := 1; lvl <= MaxLevel; lvl++ {
					p := Place(g.Queue, lvl)
					if w.listed[k.Ready(KeyPlace(p, g.Member))] {
						tx.Queue("ZADD", k.Rotation(p), now, g.Member)
					}
				}
			}
			wrote = true
		}
		return wrote
	})
}

func (s *Store) repairRetryCount(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding) (bool, error) {
	k := s.Keys
	q, ts, err := ParseMember(f.Member)
	if err != nil {
		return false, err
	}
	bucket := k.Bucket(q, ts)
	wrote := false
	_, err = s.checkRunner(o).Run(ctx, conn, []string{bucket, k.RetryCounts()}, func(tx *txn.Tx) error {
		wrote = false
		score, err := tx.Do("ZSCORE", k.Schedule(), f.Member)
		if err != nil {
			return err
		}
		var n int64
		if score != nil {
			ids, err := redis.Strings(tx.Do("LRANGE", bucket, 0, -1))
			if err != nil {
				return err
			}
			for _, id := range ids {
				raw, err := redis.Bytes(tx.Do("GET", k.Task(id)))
				if err != nil {
					continue // missing or of the wrong type: not a retry
				}
				if r, derr := DecodeRecord(id, raw); derr == nil && r.State == StateRetry {
					n++
				}
			}
		}
		stored, err := redis.Int64(tx.Do("HGET", k.RetryCounts(), f.Member))
		if err != nil && !errors.Is(err, redis.ErrNil) {
			return err
		}
		switch {
		case n == stored:
			return nil
		case n == 0:
			tx.Queue("HDEL", k.RetryCounts(), f.Member)
		default:
			tx.Queue("HSET", k.RetryCounts(), f.Member, n)
		}
		wrote = true
		return nil
	})
	return wrote, err
}

func (s *Store) repairUnregistered(ctx context.Context, conn redis.Conn, o CheckOptions, f Finding) (bool, error) {
	k := s.Keys
	wrote := false
	_, err := s.checkRunner(o).Run(ctx, conn, []string{k.Workers(), k.Inflight(f.Worker), k.Pending(f.Worker)}, func(tx *txn.Tx) error {
		wrote = false
		for _, c := range []txn.Cmd{{Name: "SISMEMBER", Args: []interface{}{k.Workers(), f.Worker}},
			{Name: "LLEN", Args: []interface{}{k.Inflight(f.Worker)}}, {Name: "ZCARD", Args: []interface{}{k.Pending(f.Worker)}}} {
			if err := tx.Send(c.Name, c.Args...); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		var n [3]int
		for i := range n {
			if n[i], err = redis.Int(reps[i], nil); err != nil {
				return err
			}
		}
		if n[0] == 1 || n[1]+n[2] == 0 {
			return nil
		}
		tx.Queue("SADD", k.Workers(), f.Worker)
		wrote = true
		return nil
	})
	return wrote, err
}
