package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// badData injects corrupted and hand-edited data into the namespace while
// the run goes on, and judges what the engine made of each injection.
type badData struct {
	h *harness
	// lane is the lane whose keys the injections write (on shards, one
	// the seed picks), keys its keys.
	lane  *lane
	laneK int
	keys  buckets.Keys

	// runningDamaged counts records deleted or corrupted while their task
	// ran (see runningGaugeAllowance).
	runningDamaged atomic.Int64

	mu    sync.Mutex
	items []*badItem
}

type badItem struct {
	name, expected string
	// what to check
	deadIDs    []string // each must be a dead letter (reason containing deadReason) and never run
	deadReason string
	runs       []string // payload words that must run at least once
	never      []string // payload words that must never run
	refused    string   // non-empty: an error the injection itself saw, or "" when refusals were as expected
	checkFn    func(*observed, map[string]string) (string, bool)
	observed   string // set by the injection (windows)
	ok         *bool
}

func newBadData(h *harness) *badData {
	k := h.rngFor("baddata-lane").IntN(len(h.lanes))
	return &badData{h: h, lane: h.lanes[k], laneK: k, keys: h.lanes[k].keys}
}

// newID is a new task id of the injections' lane: a UUID, ending with
// "~k" on shards as the ids a sharded client generates for lane k do.
func (b *badData) newID() string {
	if len(b.h.lanes) < 2 {
		return uuid.NewString()
	}
	return fmt.Sprintf("%s~%d", uuid.NewString(), b.laneK)
}

// idOpt makes the injections' enqueues use an id of their lane.
func (b *badData) idOpt(opts ...engine.Option) []engine.Option {
	if len(b.h.lanes) < 2 {
		return opts
	}
	return append(opts, engine.TaskID(b.newID()))
}

func (b *badData) add(it *badItem) {
	b.mu.Lock()
	b.items = append(b.items, it)
	b.mu.Unlock()
}

func (b *badData) do(cmd string, args ...any) (any, error) {
	c := b.lane.admin.Get()
	defer c.Close()
	return c.Do(cmd, args...)
}

// inject runs the injections: phase 1 early in the run, phase 2 (the
// keys workers block and pop on, for a few seconds each) after it.
func (b *badData) inject(ctx context.Context) {
	if !sleep(ctx, time.Second) {
		return
	}
	b.h.logf("bad data: injecting records, ids, types, payloads, index members, bucket keys into lane %d", b.laneK)
	// The injector's own set-up is not a fault target: Redis restarts
	// wait while it runs (h.injecting); connection cuts and kills do not.
	locked := func(f func()) {
		b.h.injecting.Lock()
		defer b.h.injecting.Unlock()
		f()
	}
	// Once begun, the items are set up to the end even if the fault window
	// closes meanwhile (the harness waits for this loop before draining):
	// an item cut short would be a harness failure, not the engine's.
	bg := context.WithoutCancel(ctx)
	locked(func() { b.phase1(bg) })
	if b.h.sc.BadData < 2 {
		return
	}
	sleep(bg, time.Second)
	locked(func() { b.window(bg, "ready list of the wrong type", "q:side", b.keys.Ready("side")) })
	sleep(bg, time.Second)
	locked(func() { b.window(bg, "wake-up list of the wrong type", "n:default", b.keys.Notify("default")) })
}

func (b *badData) phase1(ctx context.Context) {
	cl := b.lane.client
	bg := context.WithoutCancel(ctx)
	now := time.Now()

	// 1. Records overwritten with garbage while their ids wait in buckets.
	// Not a record, an empty one, records of versions this release does
	// not read, a state code no state has and an overlong varint.
	garbage := [][]byte{[]byte("garbage"), {}, []byte("B"), []byte("B\x03\x00\x01t"), []byte("B\x09\x00\x01t"), []byte("B\x04\x07\x01t"),
		append([]byte("B\x04"), bytes.Repeat([]byte{0xff}, 12)...)}
	corrupt := &badItem{name: "corrupted record", deadReason: "malformed",
		expected: "dead letter saying the record is malformed; never runs"}
	for i, g := range garbage {
		p := fmt.Sprintf("bad:corrupt:%d", i)
		info, err := cl.Enqueue(bg, "noop", []byte(p), b.idOpt(engine.In(2*time.Second))...)
		if err != nil {
			corrupt.refused = "enqueue: " + err.Error()
			continue
		}
		id := info.ID
		if _, err := b.do("SET", b.keys.Task(id), g); err != nil {
			corrupt.refused = "SET: " + err.Error()
		}
		corrupt.deadIDs = append(corrupt.deadIDs, id)
		corrupt.never = append(corrupt.never, p)
	}
	b.add(corrupt)

	// 2. Types nobody handles.
	unknown := &badItem{name: "unknown task type", deadReason: "no handler",
		expected: "fails without a handler, retried, dead letter after MaxAttempts(2)"}
	for i := 0; i < 3; i++ {
		info, err := cl.Enqueue(bg, fmt.Sprintf("nosuch-%d", i), []byte(fmt.Sprintf("bad:unknown:%d", i)), b.idOpt(engine.MaxAttempts(2))...)
		if err != nil {
			unknown.refused = err.Error()
			continue
		}
		id := info.ID
		unknown.deadIDs = append(unknown.deadIDs, id)
	}
	b.add(unknown)

	// 3. Payloads at the limit run.
	limit := &badItem{name: "payload at the limit", expected: fmt.Sprintf("a %d-byte payload is accepted and runs", MaxPayload)}
	for i := 0; i < 2; i++ {
		p := fmt.Sprintf("bad:limit:%d", i)
		payload := append([]byte(p+" "), bytes.Repeat([]byte("x"), MaxPayload-len(p)-1)...)
		if _, err := cl.Enqueue(bg, "noop", payload, b.idOpt()...); err != nil {
			limit.refused = err.Error()
			continue
		}
		limit.runs = append(limit.runs, p)
	}
	b.add(limit)

	// 4. Payloads over the limit are refused and write nothing.
	over := &badItem{name: "payload over the limit",
		expected: "Enqueue and EnqueueBatch return ErrTooLarge and write nothing"}
	big := append([]byte("bad:over:0 "), bytes.Repeat([]byte("y"), MaxPayload)...)
	var problems []string
	if _, err := cl.Enqueue(bg, "noop", big); !errors.Is(err, engine.ErrTooLarge) {
		problems = append(problems, fmt.Sprintf("Enqueue: %v", err))
	}
	if _, err := cl.EnqueueBatch(bg, []engine.NewTask{{Type: "noop", Payload: []byte("bad:overbatch:0")}, {Type: "noop", Payload: big}}); !errors.Is(err, engine.ErrTooLarge) {
		problems = append(problems, fmt.Sprintf("EnqueueBatch: %v", err))
	}
	over.never = []string{"bad:over:0", "bad:overbatch:0"}
	// The same in an empty namespace, where "nothing" can be counted.
	if c2, err := engine.NewClient(engine.Config{Namespace: "chaos-over", MaxPayload: MaxPayload}, b.lane.pool); err == nil {
		_, err1 := c2.Enqueue(bg, "noop", big)
		_, err2 := c2.EnqueueBatch(bg, []engine.NewTask{{Type: "noop", Payload: []byte("ok")}, {Type: "noop", Payload: big}})
		_, err3 := c2.Enqueue(bg, "noop", big, engine.In(time.Second))
		for i, err := range []error{err1, err2, err3} {
			if !errors.Is(err, engine.ErrTooLarge) {
				problems = append(problems, fmt.Sprintf("empty namespace, call %d: %v", i+1, err))
			}
		}
		if ks, err := redis.Strings(b.do("KEYS", "{chaos-over}:*")); err != nil || len(ks) > 0 {
			problems = append(problems, fmt.Sprintf("empty namespace holds %d keys after refused enqueues %v (%v)", len(ks), ks, err))
		}
	}
	over.refused = strings.Join(problems, "; ")
	b.add(over)

	// 5. Records deleted while their ids wait in buckets.
	deleted := &badItem{name: "record deleted, id in bucket", deadReason: "missing",
		expected: "dead letter saying the record is missing; never runs"}
	for i := 0; i < 3; i++ {
		p := fmt.Sprintf("bad:deleted:%d", i)
		info, err := cl.Enqueue(bg, "noop", []byte(p), b.idOpt(engine.In(2*time.Second))...)
		if err != nil {
			deleted.refused = err.Error()
			continue
		}
		id := info.ID
		if _, err := b.do("DEL", b.keys.Task(id)); err != nil {
			deleted.refused = err.Error()
		}
		deleted.deadIDs = append(deleted.deadIDs, id)
		deleted.never = append(deleted.never, p)
	}
	b.add(deleted)

	// 6. Ids without records pushed straight into a ready list and a bucket.
	ghosts := &badItem{name: "id without record in lists", deadReason: "missing",
		expected: "ids with no record, in a ready list and in a bucket, become dead letters saying so"}
	for i := 0; i < 2; i++ {
		id := b.newID()
		if _, err := b.do("LPUSH", b.keys.Ready("default"), id); err != nil {
			ghosts.refused = err.Error()
		}
		ghosts.deadIDs = append(ghosts.deadIDs, id)
	}
	ts := buckets.BucketTime(now.Add(1500*time.Millisecond).UnixMilli(), 10)
	gid := b.newID()
	if _, err := b.do("RPUSH", b.keys.Bucket("default", ts), gid); err == nil {
		_, err = b.do("ZADD", b.keys.Schedule(), ts, buckets.Member("default", ts))
		if err == nil {
			// Counted as scheduled, as if its record was deleted after
			// the enqueue: the move that takes it subtracts it again.
			_, err = b.do("HINCRBY", b.keys.Stats("default"), buckets.StatScheduled, 1)
		}
		if err != nil {
			ghosts.refused = err.Error()
		}
	}
	ghosts.deadIDs = append(ghosts.deadIDs, gid)
	b.add(ghosts)

	// 7. A garbage id (not a UUID) in a ready list.
	const garbageID = "not-a-uuid!"
	_, gerr := b.do("LPUSH", b.keys.Ready("default"), garbageID)
	b.add(&badItem{name: "garbage id in ready list", expected: "taken and set aside as a dead letter",
		refused: errStr(gerr), checkFn: func(*observed, map[string]string) (string, bool) {
			score, err := b.do("ZSCORE", b.keys.Dead(), garbageID)
			if err != nil {
				return err.Error(), false
			}
			left, _ := redis.Int(b.do("LREM", b.keys.Ready("default"), 0, garbageID))
			if score == nil {
				return fmt.Sprintf("not in the dead-letter index; %d copies still in the ready list", left), false
			}
			return "in the dead-letter index", true
		}})

	// 8. Garbage members in the bucket index.
	members := []string{"garbage-member", "no/such queue:12", "default:notanumber", ":5"}
	for _, m := range members {
		if _, err := b.do("ZADD", b.keys.Schedule(), now.Add(-time.Second).UnixMilli(), m); err != nil {
			gerr = err
		}
	}
	b.add(&badItem{name: "garbage index members", expected: "dropped from the index; dispatching goes on",
		refused: errStr(gerr), checkFn: func(*observed, map[string]string) (string, bool) {
			var left []string
			for _, m := range members {
				if s, _ := b.do("ZSCORE", b.keys.Schedule(), m); s != nil {
					left = append(left, m)
				}
			}
			if len(left) > 0 {
				return fmt.Sprintf("still indexed: %q", left), false
			}
			return "all dropped from the index", true
		}})

	// 9. A bucket key of the wrong type, indexed (its time is not a
	// multiple of the resolution, so no task of the run is in it).
	bts := buckets.BucketTime(now.Add(time.Second).UnixMilli(), 10) + 3
	bkey := b.keys.Bucket("default", bts)
	_, gerr = b.do("SET", bkey, "not a list")
	if gerr == nil {
		_, gerr = b.do("ZADD", b.keys.Schedule(), bts, buckets.Member("default", bts))
	}
	b.add(&badItem{name: "bucket key of wrong type", expected: "set aside under bad:, dropped from the index",
		refused: errStr(gerr), checkFn: func(*observed, map[string]string) (string, bool) {
			q, _ := redis.Int(b.do("EXISTS", b.keys.Quarantine(bkey)))
			s, _ := b.do("ZSCORE", b.keys.Schedule(), buckets.Member("default", bts))
			typ, _ := redis.String(b.do("TYPE", bkey))
			obs := fmt.Sprintf("quarantined: %v, still indexed: %v, key now %s", q == 1, s != nil, typ)
			return obs, q == 1 && s == nil
		}})

	// 12. Record keys of the wrong type: a LIST at t:<id> while the id
	// waits in a bucket, and an id pushed straight into a ready list with
	// a LIST for a record.
	wrong := &badItem{name: "record key of the wrong type", deadReason: "wrong type",
		expected: "record key set aside under bad:, dead letter saying so; never runs; the slot and the recovery go on"}
	for i := 0; i < 3; i++ {
		p := fmt.Sprintf("bad:wrongtype:%d", i)
		info, err := cl.Enqueue(bg, "noop", []byte(p), b.idOpt(engine.In(2*time.Second))...)
		if err != nil {
			wrong.refused = "enqueue: " + err.Error()
			continue
		}
		id := info.ID
		if _, err := b.do("DEL", b.keys.Task(id)); err != nil {
			wrong.refused = "DEL: " + err.Error()
		}
		if _, err := b.do("RPUSH", b.keys.Task(id), "not", "a", "record"); err != nil {
			wrong.refused = "RPUSH: " + err.Error()
		}
		wrong.deadIDs = append(wrong.deadIDs, id)
		wrong.never = append(wrong.never, p)
	}
	wid := b.newID()
	if _, err := b.do("RPUSH", b.keys.Task(wid), "not", "a", "record"); err == nil {
		if _, err := b.do("LPUSH", b.keys.Ready("default"), wid); err != nil {
			wrong.refused = "LPUSH: " + err.Error()
		}
		wrong.deadIDs = append(wrong.deadIDs, wid)
	} else {
		wrong.refused = "RPUSH: " + err.Error()
	}
	b.add(wrong)

	// 10-11. The record of a running task corrupted or deleted.
	for _, v := range []struct{ name, cmd string }{{"record corrupted while running", "SET"}, {"record deleted while running", "DEL"}} {
		p := "bad:" + strings.ReplaceAll(v.name, " ", "-")
		it := &badItem{name: v.name, expected: "the run's result is dropped or dead-lettered with a log line; the worker slot does not retry forever"}
		// On the side queue where the workers serve one: it starts
		// promptly, not behind the scenario's backlog on default.
		q := "default"
		if b.h.sc.BadData >= 2 {
			q = "side"
		}
		info, err := cl.Enqueue(bg, "slow", []byte(p), b.idOpt(engine.Queue(q))...)
		if err != nil {
			it.refused = err.Error()
			b.add(it)
			continue
		}
		id := info.ID
		// It waits behind the scenario's backlog, and in "combined" behind
		// kills and Redis restarts too, on a loaded machine for tens of
		// seconds: lateness is judged elsewhere, and the bound only ends a
		// run whose task never starts.
		if !b.waitStarted(bg, id, badWait) {
			it.refused = fmt.Sprintf("the slow task did not start within %v", badWait)
			b.add(it)
			continue
		}
		args := []any{b.keys.Task(id)}
		if v.cmd == "SET" {
			args = append(args, "garbage")
		}
		if _, err := b.do(v.cmd, args...); err != nil {
			it.refused = err.Error()
		} else {
			b.runningDamaged.Add(1)
		}
		it.checkFn = func(*observed, map[string]string) (string, bool) { return b.finishRetries(id) }
		b.add(it)
	}
}

// waitStarted waits until a handler ledger has a start line for id.
func (b *badData) waitStarted(ctx context.Context, id string, d time.Duration) bool {
	needle := []byte("S " + id + " ")
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, p := range b.h.allProcs() {
			if p.Role != roleWorker {
				continue
			}
			if data, err := os.ReadFile(p.LedgerPath); err == nil && bytes.Contains(data, needle) {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// finishRetries judges a run whose record went bad under it: how often
// did a worker try to record its result?
func (b *badData) finishRetries(id string) (string, bool) {
	tries, permanent := 0, 0
	var first, last time.Time
	var lastErr, who string
	for _, p := range b.h.allProcs() {
		if p.Role != roleWorker {
			continue
		}
		data, err := os.ReadFile(p.LogPath)
		if err != nil {
			continue
		}
		for _, l := range bytes.Split(data, []byte("\n")) {
			if !bytes.Contains(l, []byte(id)) || !bytes.Contains(l, []byte(`"record result failed`)) {
				continue
			}
			var m struct {
				Time time.Time `json:"time"`
				Err  string    `json:"err"`
			}
			_ = json.Unmarshal(l, &m)
			if tries == 0 {
				first = m.Time
			}
			tries++
			if permanentErr(m.Err) {
				permanent++
			}
			last, lastErr = m.Time, m.Err
			how := "still retrying when the worker was stopped at the end of the run"
			if syscall.Signal(p.sig.Load()) == syscall.SIGKILL {
				how = "until the worker was killed"
			}
			who = fmt.Sprintf("%s, %s", p.Name, how)
		}
	}
	score, _ := b.do("ZSCORE", b.keys.Dead(), id)
	state := "not a dead letter"
	if score != nil {
		state = "a dead letter"
	}
	if permanent >= 2 {
		return fmt.Sprintf("the worker slot kept retrying to record the result of a run whose record is gone or malformed: "+
			"%d logged retries over %v (the log keeps the first 8 and every 20th), %s; the task is %s; last error: %s",
			tries, last.Sub(first).Round(100*time.Millisecond), who, state, firstLine(lastErr)), false
	}
	return fmt.Sprintf("%d logged retries; the task is %s", tries, state), true
}

// badWindow is how long a key workers pop or block on stays a string.
const badWindow = 2500 * time.Millisecond

// window sets key to a string for badWindow, watches how many runs start
// meanwhile against as long before, then puts the key right (restoring
// a ready list's ids) if the engine did not.
func (b *badData) window(ctx context.Context, name, short, key string) {
	it := &badItem{name: name + " (" + short + ")",
		expected: fmt.Sprintf("logged and set aside or skipped; the other tasks keep running (%v window)", badWindow)}
	start := time.Now()
	c := b.lane.admin.Get()
	defer c.Close()
	rep, err := txn.Run(ctx, c, nil, func(tx *txn.Tx) error {
		tx.Queue("LRANGE", key, 0, -1)
		tx.Queue("DEL", key)
		tx.Queue("SET", key, "not a list")
		return nil
	})
	var held []string
	if err == nil && len(rep) == 3 {
		held, _ = redis.Strings(rep[0], nil)
	} else {
		it.refused = fmt.Sprintf("inject: %v", err)
	}
	b.h.logf("bad data: %s set to a string for %v", short, badWindow)
	c.Close()
	sleep(context.Background(), badWindow)
	// A fresh connection: the server may close one idle for the window
	// (Scenario.ServerTimeout), and a failed restore would lose the ids
	// this injector took out of the list.
	var typ string
	var quarantined int
	restore := func() error {
		c := b.lane.admin.Get()
		defer c.Close()
		var err error
		if typ, err = redis.String(c.Do("TYPE", key)); err != nil {
			return err
		}
		if quarantined, err = redis.Int(c.Do("EXISTS", b.keys.Quarantine(key))); err != nil {
			return err
		}
		if typ == "string" {
			if _, err := c.Do("DEL", key); err != nil {
				return err
			}
		}
		if len(held) > 0 {
			args := []any{key}
			for _, id := range held {
				args = append(args, id)
			}
			if _, err := c.Do("RPUSH", args...); err != nil {
				return err
			}
		}
		return nil
	}
	var rerr error
	for try := 0; try < 20; try++ {
		if rerr = restore(); rerr == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if rerr != nil {
		it.refused = fmt.Sprintf("restore %d ids: %v", len(held), rerr)
	}
	before, during := b.runsAround(start, badWindow)
	it.observed = fmt.Sprintf("runs started in the %v before: %d, during: %d; engine set it aside: %v; still a string after %v: %v",
		badWindow, before, during, quarantined == 1, badWindow, typ == "string")
	ok := during*4 >= before
	it.ok = &ok
	b.add(it)
	_ = ctx
}

// runsAround counts runs that started in the d before t and the d after.
func (b *badData) runsAround(t time.Time, d time.Duration) (before, during int) {
	obs, err := b.h.collect()
	if err != nil {
		return 0, 0
	}
	t0, t1, t2 := t.Add(-d).UnixMilli(), t.UnixMilli(), t.Add(d).UnixMilli()
	for _, runs := range obs.runs {
		for _, r := range runs {
			switch {
			case r.Start >= t0 && r.Start < t1:
				before++
			case r.Start >= t1 && r.Start < t2:
				during++
			}
		}
	}
	return before, during
}

// badWait bounds a wait of the bad-data injections for the engine (a
// task to start, dead letters to appear): long enough for a loaded
// machine, where the scenario's backlog runs tens of seconds late.
const badWait = 2 * time.Minute

// settle waits (up to badWait) for the injections' dead letters to appear.
func (b *badData) settle(ctx context.Context) {
	deadline := time.Now().Add(badWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		dead, err := b.h.deadSet()
		if err == nil {
			missing := 0
			b.mu.Lock()
			for _, it := range b.items {
				for _, id := range it.deadIDs {
					if !dead[id] {
						missing++
					}
				}
			}
			b.mu.Unlock()
			if missing == 0 {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// verdicts judges every injection.
func (b *badData) verdicts(obs *observed, dead map[string]string) []BadVerdict {
	ran := map[string]int{}
	for _, runs := range obs.runs {
		for _, r := range runs {
			if strings.HasPrefix(r.Payload, "bad:") {
				ran[r.Payload]++
			}
		}
	}
	b.mu.Lock()
	items := append([]*badItem(nil), b.items...)
	b.mu.Unlock()
	if b.h.sc.BadData >= 2 {
		items = append(items, b.wrongTypeEnqueues(obs))
	}
	var out []BadVerdict
	for _, it := range items {
		var notes []string
		ok := true
		if it.refused != "" {
			ok = false
			notes = append(notes, it.refused)
		}
		if len(it.deadIDs) > 0 {
			nDead, reasons := 0, map[string]bool{}
			for _, id := range it.deadIDs {
				if r, isDead := dead[id]; isDead {
					nDead++
					reasons[firstLine(r)] = true
					if it.deadReason != "" && !strings.Contains(r, it.deadReason) && !strings.Contains(r, "listed in the dead-letter index") {
						ok = false
					}
				}
			}
			if nDead < len(it.deadIDs) {
				ok = false
			}
			notes = append(notes, fmt.Sprintf("%d/%d dead letters (reasons: %s)", nDead, len(it.deadIDs), strings.Join(sortedKeys(reasons), " | ")))
		}
		for _, p := range it.runs {
			if ran[p] == 0 {
				ok = false
				notes = append(notes, p+" never ran")
			}
		}
		if len(it.runs) > 0 && ok {
			notes = append(notes, fmt.Sprintf("%d/%d ran", len(it.runs), len(it.runs)))
		}
		for _, p := range it.never {
			if ran[p] > 0 {
				ok = false
				notes = append(notes, fmt.Sprintf("%s ran %d times", p, ran[p]))
			}
		}
		if len(it.never) > 0 && ok && len(it.deadIDs) == 0 {
			notes = append(notes, "refused as expected, nothing ran")
		}
		if it.checkFn != nil {
			o, good := it.checkFn(obs, dead)
			ok = ok && good
			notes = append(notes, o)
		}
		if it.observed != "" {
			notes = append(notes, it.observed)
		}
		if it.ok != nil {
			ok = ok && *it.ok
		}
		out = append(out, BadVerdict{Name: it.name, Expected: it.expected, Observed: strings.Join(notes, "; "), OK: ok})
	}
	return out
}

func errStr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// wrongTypeEnqueues judges the enqueues that met a key of the wrong type
// (the windows): EnqueueBatch documents "all of them are written, or
// (with an error) none".
func (b *badData) wrongTypeEnqueues(obs *observed) *badItem {
	it := &badItem{name: "enqueue meeting a wrong-type key",
		expected: "EnqueueBatch returns an error and writes nothing, or succeeds (all or none)"}
	calls, whole, part := 0, 0, 0
	for bid, bt := range obs.batches {
		if !strings.Contains(bt.Failed, "WRONGTYPE") {
			continue
		}
		calls++
		switch got := len(obs.batchRuns[bid]); {
		case got == bt.N:
			whole++
		case got > 0:
			part++
		}
	}
	it.observed = fmt.Sprintf("%d calls returned a WRONGTYPE error; of their batches %d ran whole and %d in part (their other commands ran inside EXEC)",
		calls, whole, part)
	ok := whole == 0 && part == 0
	it.ok = &ok
	return it
}
