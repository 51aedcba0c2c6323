package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/txn"
)

// fetcher takes tasks: it picks the order of the queues, pops an id into
// the in-flight list and claims it. When every queue is empty it waits
// with the waiter.
type fetcher struct {
	w       *worker
	queues  []string
	weights []float64
	waiter  *waiter
	l       lane // the fetching loop's connection
	bo      rconn.Backoff
	k       atomic.Int64 // tasks the next pop asks for when slots are free (adapts)

	// A queue whose task the worker gave back for another worker (a type
	// it does not serve) is left out of the fetch order for a while, which
	// doubles while it keeps happening: the task waits at the front for a
	// worker that serves it, and this one does not spin on it.
	skipMu    sync.Mutex
	skipUntil map[string]time.Time     // guarded by skipMu
	skipStep  map[string]time.Duration // guarded by skipMu

	// Priority levels above 1: the places (buckets.Place) of each
	// queue's levels in use, as last read from the levels set, and those
	// a pop found empty since. A queue's level 1 is popped first on every
	// fetch; its other levels only when level 1 was empty, each in level
	// order, and a level found empty is left out until the set is read
	// again: at most once per levelsRefresh while fetches find a level 1
	// empty, and at the first such fetch after each wake.
	lvMu     sync.Mutex
	lvPlaces map[string][]string // guarded by lvMu
	lvEmpty  map[string]bool     // guarded by lvMu
	lvRead   time.Time           // guarded by lvMu; zero: read at the next need
	// lowLevel: the last pop that took tasks took them from a level above
	// 1, where the worker claims no task ahead (processor.prefetching).
	lowLevel atomic.Bool
	lim      limits // the queues' concurrency limits (limits.go)
}

// levelsRefresh is how often, at most, a fetching worker reads the levels
// set, and so how long a level found empty may be left out of its fetches
// (a task pushed to it meanwhile may start after tasks of the levels below
// it, for that long at most).
const levelsRefresh = time.Second

// Skip intervals after a task is given back for another worker.
const (
	minSkip = 50 * time.Millisecond
	maxSkip = time.Second
)

// skip leaves q out of the fetch order for an interval, which doubles
// when the previous one ended without a claim of q in between (give-backs
// of tasks popped during one interval count once).
func (f *fetcher) skip(q string) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	now := time.Now()
	if until, ok := f.skipUntil[q]; ok && now.Before(until) {
		return
	}
	d := min(max(2*f.skipStep[q], minSkip), maxSkip)
	f.skipStep[q] = d
	f.skipUntil[q] = now.Add(d)
}

// unskip forgets q's interval after a task of q was claimed.
func (f *fetcher) unskip(q string) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	if _, ok := f.skipStep[q]; ok {
		delete(f.skipStep, q)
		delete(f.skipUntil, q)
	}
}

// skipped reports whether q is left out now, and until when.
func (f *fetcher) skipped(q string, now time.Time) (time.Time, bool) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	until, ok := f.skipUntil[q]
	return until, ok && now.Before(until)
}

// available reports whether the worker takes tasks from q now: it is
// neither paused, skipped, nor set aside as full.
func (f *fetcher) available(q string, now time.Time) bool {
	q = buckets.QueueOf(q)
	if f.w.control.isPaused(q) {
		return false
	}
	if _, full := f.lim.isFull(q, now); full {
		return false
	}
	_, skip := f.skipped(q, now)
	return !skip
}

func newFetcher(w *worker) *fetcher {
	f := &fetcher{w: w, skipUntil: map[string]time.Time{}, skipStep: map[string]time.Duration{}}
	f.waiter = &waiter{waiterParams: waiterParams{f: f, control: w.control, store: w.store, keys: w.keys,
		idleWait: w.cfg.Advanced.IdleWait, hub: w.cfg.lane.hub, log: w.log}}
	f.waiter.blocker.Pool = w.pool
	f.l.h.Pool = w.pool
	f.k.Store(1)
	for _, q := range w.cfg.Queues {
		f.queues = append(f.queues, q.Name)
		f.weights = append(f.weights, float64(q.Weight))
	}
	return f
}

// claimed is a task claimed by this worker, with the lane that may keep
// the claim's WATCH on the record.
type claimed struct {
	rec *buckets.Record
	l   *lane
	// held: the claim left its watch on l for this run's result.
	held bool
	// batch: the claim of a batch left its watch for the batch's results,
	// which this run's joins (heldGroup); nil otherwise.
	batch *heldGroup
	// waited: the claim found the task waited for (its waiter mark, which
	// the held watch covers), for the result recorded with that watch.
	waited bool
	// tok is a batch run's slot token (nil: the caller's business). Its
	// group gives it back with all of the group's slots at once, so that
	// the fetching loop takes as many tasks together (see
	// committer.commit), or a heldGroup takes it over for the next batch.
	tok *slotToken
	// counted: processor.running already counts the run.
	counted bool
	// turn and next order a batch's runs (processor.startRun): turn is
	// closed once the run claimed before this one has its slot or went
	// back, and this run closes next once it has (nil: no order).
	turn, next chan struct{}
	// order is the batch's claim order and idx this run's place in it:
	// a run given back unstarted takes those after it along (nil: alone).
	order *claimOrder
	idx   int
}

// want is how many tasks the next pop asks for: 1 while the queues look
// shallow, growing while every pop finds all it asked for, up to
// Config.Advanced.ClaimBatch. The caller bounds it by its free slots.
func (f *fetcher) want() int {
	return min(int(f.k.Load()), f.w.cfg.Advanced.ClaimBatch)
}

// adapt learns from a pop that asked for n tasks and found got: a pop
// that found all it asked for doubles the next ask (the backlog is deep
// enough), one that found fewer asks for as many as it found.
func (f *fetcher) adapt(n, got int) {
	if got >= n {
		f.k.Store(int64(min(max(int(f.k.Load()), 2*n), f.w.cfg.Advanced.ClaimBatch)))
	} else {
		f.k.Store(int64(max(got, 1)))
	}
}

// shallow reports whether the queues look shallow: a finishing task then
// takes the next one with its result, instead of leaving its slot to the
// fetching loop, which takes several at once.
func (f *fetcher) shallow() bool { return f.w.cfg.Advanced.ClaimBatch <= 1 || f.k.Load() <= 1 }

// next pops up to n tasks (at least 1) of one queue into the in-flight
// list; the in-flight set holds their ids until the caller's claim. When
// every queue is empty it waits for a wake, and then asks bound how many
// of the n it may still take: n was chosen before the wait, and the
// handlers may all have become busy since. When bound says none, next
// returns no ids, for the caller to decide again. It returns false when
// ctx ended.
func (f *fetcher) next(ctx context.Context, n int, bound func(n int) int) (string, []string, bool) {
	w := f.w
	for ctx.Err() == nil {
		if !w.hb.alive() {
			// Heartbeats are failing: take nothing until one succeeds.
			if !rconn.Sleep(ctx, min(w.cfg.Advanced.HeartbeatInterval, time.Second)) {
				break
			}
			continue
		}
		var q string
		ids, err := w.inflight.popMany(func() ([]string, bool, error) {
			var ids []string
			var err error
			ids, q, err = f.popAny(ctx, n)
			return ids, err != nil && !buckets.IsServerError(err), err
		})
		if err != nil && len(ids) == 0 {
			if !f.bo.Wait(ctx, w.log, "fetch", err) {
				break
			}
			continue
		}
		if err == nil {
			f.bo.Reset()
		}
		if len(ids) == 0 {
			f.k.Store(1)
			if !f.waiter.wait(ctx) {
				break
			}
			f.levelsStale()
			if n = bound(n); n <= 0 {
				return "", nil, true
			}
			continue
		}
		f.adapt(n, len(ids))
		_, lvl := buckets.SplitPlace(q)
		f.lowLevel.Store(lvl > 1)
		return q, ids, true
	}
	return "", nil, false
}

func (f *fetcher) close() {
	f.waiter.close()
	f.l.close()
}

// order is the order to try the available queues (neither paused nor
// skipped) in for one fetch: as configured under strict priority;
// otherwise a weighted random order, so each queue comes first in
// proportion to its weight. It is empty when no queue is available.
func (f *fetcher) order() []string {
	now := time.Now()
	avail := f.queues
	for i, q := range f.queues {
		if !f.available(q, now) {
			avail = nil
			for j, q := range f.queues {
				if j < i || (j > i && f.available(q, now)) {
					avail = append(avail, q)
				}
			}
			break
		}
	}
	if f.w.cfg.StrictPriority || len(avail) <= 1 {
		return avail
	}
	type kq struct {
		k float64
		q string
	}
	ks := make([]kq, 0, len(avail))
	for i, q := range f.queues {
		if !slices.Contains(avail, q) {
			continue
		}
		// Efraimidis-Spirakis: sorting by u^(1/w) samples without
		// replacement in proportion to weight.
		ks = append(ks, kq{math.Pow(rand.Float64(), 1/f.weights[i]), q})
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].k > ks[j].k })
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.q
	}
	return out
}

// popAny takes tasks from the first queue in order() that has one: its
// level 1 first, then, when that was empty, its levels in use (levels) in
// level order. A queue whose ready list (or the in-flight list) has the
// wrong type is set aside and the other queues are tried; a connection
// failure is returned. It returns the place (buckets.Place) the ids were
// taken from.
//
// It takes up to n tasks of that one place in one round trip (store.Pop),
// so a batch never mixes queues or levels: under strict priority a lower
// queue is popped only when every queue before it was empty, and a level
// only when the levels before it were.
func (f *fetcher) popAny(ctx context.Context, n int) (ids []string, q string, err error) {
	if err := f.refreshLimits(ctx, &f.l); err != nil { // popBound reads them
		return nil, "", err
	}
	var bad error
	for _, q := range f.order() {
		ids, wrong, err := f.popPlace(ctx, q, f.popBound(q, n))
		if wrong != nil {
			bad = wrong
		}
		if err != nil || len(ids) > 0 {
			return ids, q, err
		}
		places, err := f.levels(ctx, q)
		if err != nil {
			return nil, "", err
		}
		for _, p := range places {
			var ids []string
			var wrong, err error
			if lvl, keyed := strings.CutSuffix(p, "#"); keyed {
				var kp string
				kp, ids, wrong, err = f.popKeyed(ctx, lvl, f.popBound(q, n))
				if err != nil || len(ids) > 0 {
					return ids, kp, err
				}
			} else {
				ids, wrong, err = f.popPlace(ctx, p, f.popBound(q, n))
			}
			if wrong != nil {
				bad = wrong
			}
			if err != nil || len(ids) > 0 {
				return ids, p, err
			}
			if wrong == nil {
				f.emptied(p)
			}
		}
	}
	return nil, "", bad
}

// popPlace pops up to n ids of one place. A ready list (or in-flight list)
// of the wrong type (the store set it aside) is reported as wrong, not as
// err.
func (f *fetcher) popPlace(ctx context.Context, p string, n int) (ids []string, wrong, err error) {
	r, err := f.w.store.Pop(ctx, &f.l, p, n)
	if err != nil && buckets.IsWrongType(err) {
		return r.ids, err, nil
	}
	return r.ids, nil, err
}

// popKeyed pops up to n tasks of one key of level place p, the key taken
// in turn (buckets.Store.PopKey); it returns the key's place. When no
// key's time has come it notes when the next one's does, for the idle
// wait. A rotation or a key's list of the wrong type (the store set it
// aside) is reported as wrong, not as err.
func (f *fetcher) popKeyed(ctx context.Context, p string, n int) (kp string, ids []string, wrong, err error) {
	r, err := f.w.store.Pop(ctx, &f.l, p+"#", n)
	kp, ids, next := r.place, r.ids, r.next
	if err != nil && buckets.IsWrongType(err) {
		return kp, ids, err, nil
	}
	if next > 0 {
		f.lim.wakeAt(p, time.UnixMilli(next))
	}
	return kp, ids, nil, err
}

// levels returns the places of queue q's levels above 1 to pop when its
// level 1 was empty: those in use as the levels set said when last read,
// less those found empty since. It reads the set again (one SMEMBERS) when
// the last read is levelsRefresh old or a wake came since. A set that
// cannot be read for a reason of the server's (a key of the wrong type,
// set aside) counts as empty until the next read; a connection failure
// is returned.
func (f *fetcher) levels(ctx context.Context, q string) ([]string, error) {
	f.lvMu.Lock()
	stale := f.lvRead.IsZero() || time.Since(f.lvRead) >= levelsRefresh
	f.lvMu.Unlock()
	if stale {
		w := f.w
		lv, err := w.store.Levels(ctx, &f.l)
		if err != nil && !buckets.IsServerError(err) {
			return nil, err
		}
		if err != nil {
			w.log.Warn("could not read the priority levels in use; popping level 1 only until the next read", keyErr, err)
		}
		f.lvMu.Lock()
		f.lvPlaces, f.lvEmpty, f.lvRead = lv, map[string]bool{}, time.Now()
		f.lvMu.Unlock()
	}
	f.lvMu.Lock()
	defer f.lvMu.Unlock()
	var out []string
	for _, p := range f.lvPlaces[q] {
		if !f.lvEmpty[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// emptied leaves place p out of the fetches until the levels set is read
// again.
func (f *fetcher) emptied(p string) {
	f.lvMu.Lock()
	defer f.lvMu.Unlock()
	if f.lvEmpty != nil {
		f.lvEmpty[p] = true
	}
}

// levelsStale makes the next fetch that finds a level 1 empty read the
// levels set again: after a wake, tasks may wait at any level.
func (f *fetcher) levelsStale() {
	f.lvMu.Lock()
	defer f.lvMu.Unlock()
	f.lvRead = time.Time{}
}

// claimTries bounds the attempts to claim one popped id. Past them the id
// is given back: it stays in the in-flight list, and the recoverer
// returns it to its queue (or dead-letters it) on its own connection, so
// that no error holds a slot, or the recovery, for longer.
const claimTries = 6

// claim records the popped task as running, and ends the hold on its id
// whatever happens. A failure is retried a few times on a tested
// connection (a lost EXEC reply is recognised by the ClaimState); an
// error reply of the server or a failure that persists gives the id back.
//
// cs, when given, is the id's claim state from an earlier attempt (a
// batch's); hold leaves the claim's watch on l for the result (Finish
// with held).
func (f *fetcher) claim(ctx context.Context, l *lane, q, id string, cs *buckets.ClaimState, hold bool) (*buckets.Record, bool, bool) {
	if !f.w.inflight.lockClaim(ctx, id) {
		// Stopping: the id stays in the in-flight list, which the worker
		// gives back when it unregisters.
		f.w.inflight.release(id, true)
		return nil, false, false
	}
	defer f.w.inflight.unlockClaim(id)
	return f.claimLocked(ctx, l, q, id, cs, hold)
}

// claimLocked is claim for a caller that holds id's claim lock. Besides
// the record it returns whether the claim left its watch on l, and
// whether it found the task waited for (ClaimState.Waited).
func (f *fetcher) claimLocked(ctx context.Context, l *lane, q, id string, cs *buckets.ClaimState, hold bool) (*buckets.Record, bool, bool) {
	w := f.w
	var bo rconn.Backoff
	if cs == nil {
		cs = &buckets.ClaimState{} // recognises our own claim if a reply is lost
	}
	for try := 1; ; try++ {
		err := f.refreshLimits(ctx, l)
		if err == nil {
			cs.Serves, cs.UnservedGrace, cs.Limits = w.serves, w.cfg.unservedGraceMs(), f.lim.of(buckets.QueueOf(q))
			one := []buckets.ClaimState{*cs}
			recs, res, cerr := w.store.Claim(ctx, l, q, []string{id}, one, hold)
			*cs = one[0]
			if cerr == nil {
				w.inflight.release(id, false)
				f.claimed(q, id, res[0], cs)
				if recs[0] == nil {
					return nil, false, false
				}
				return recs[0], cs.Held() != nil, cs.Waited()
			}
			err = cerr
			if buckets.IsWrongType(err) {
				// A command failed on the server: a key the claim writes
				// has the wrong type, which the store set aside. Once more.
				try = max(try, claimTries-1)
			}
		}
		if try >= claimTries || ctx.Err() != nil {
			w.log.Error("could not claim a task; giving it back to be returned to its queue", keyTaskID, id, keyQueue, q, keyErr, err, "tries", try)
			w.inflight.release(id, true)
			return nil, false, false
		}
		_ = bo.Wait(ctx, w.log, "claim", err)
	}
}

// claimed acts on what a claim of id, popped from place p, found, with
// the claim's state cs after it: when a task given back for its flow
// control may be looked at again, the slots of the queue's limit left
// free.
func (f *fetcher) claimed(p, id string, res buckets.ClaimResult, cs *buckets.ClaimState) {
	w := f.w
	q := buckets.QueueOf(p) // the place's queue
	until := cs.Until
	if cs.Limits.MaxRunning > 0 && (res == buckets.Claimed || res == buckets.Full) {
		f.lim.noteFree(q, cs.Free)
	}
	switch res {
	case buckets.Claimed:
		f.unskip(q)
	case buckets.Full:
		f.lim.setFull(q, time.Now().Add(limitRead))
		w.log.Debug("every slot of the queue's concurrency limit in use; task given back", keyTaskID, id, keyQueue, q)
	case buckets.Throttled:
		f.lim.setFull(q, time.UnixMilli(until))
		f.lim.wakeAt(q, time.UnixMilli(until))
		w.log.Debug("the queue's rate window is full; task given back", keyTaskID, id, keyQueue, q)
	case buckets.KeyFull:
		// The key comes in turn again when a slot of it is freed (the
		// release wakes a worker), or in a second.
		w.log.Debug("every slot of the task's key in use; task given back and the key out of turn", keyTaskID, id, keyQueue, q)
	case buckets.KeyThrottled:
		lvl, _ := buckets.SplitKey(p)
		f.lim.wakeAt(lvl, time.UnixMilli(until))
		w.log.Debug("the task's key's rate window is full; task given back and the key out of turn until it opens", keyTaskID, id, keyQueue, q)
	case buckets.Paused:
		w.control.set(q, true)
		w.log.Debug("queue paused; task given back", keyTaskID, id, keyQueue, q)
	case buckets.NotServed:
		f.skip(q)
		w.log.Debug("no handler for the task's type here; given back for a worker that serves it", keyTaskID, id, keyQueue, q)
	case buckets.Buried:
		w.log.Error("task record missing, malformed or of the wrong type; sent to the dead letters", keyTaskID, id, keyQueue, q)
	case buckets.Expired:
		w.log.Info("task expired before it started; sent to the dead letters", keyTaskID, id, keyQueue, q)
		if o := w.cfg.Observer; o != nil {
			o.Observe(Event{Kind: EventDead, Queue: q, TaskID: id, Time: w.cfg.Advanced.Clock.Now(), Reason: buckets.ReasonExpired})
		}
	case buckets.Skipped:
		w.log.Debug("task cancelled or not waiting; dropped", keyTaskID, id, keyQueue, q)
	}
}

// claimBatch claims ids popped together from queue q in one transaction
// (store.Claim) and ends the hold on every id whatever happens. It returns
// one record per id, nil for an id not claimed, each with its claim
// state. A connection failure is retried a few times as claim's; an error
// reply of the server (a key of the wrong type) or a conflict that
// persists falls back to claiming each id on its own, which sets such
// keys aside. ctx ended before the claim: the ids stay in the in-flight
// list, which the worker gives back when it unregisters.
//
// With hold, the batch transaction leaves its watch on l (ClaimState.Held
// of the runs it covers) for the batch's results: the caller then runs
// nothing else on l until they are recorded.
func (f *fetcher) claimBatch(ctx context.Context, l *lane, q string, ids []string, hold bool) ([]*buckets.Record, []buckets.ClaimState) {
	w := f.w
	// An id another slot of the process is claiming (a second copy of
	// it) is claimed on its own, after that claim (see lockClaim).
	// The batch's locks are let go before those claims wait for theirs,
	// so that two batches never wait for each other.
	all := ids
	var later []int
	ids = nil
	for i, id := range all {
		if w.inflight.tryLockClaim(id) {
			ids = append(ids, id)
		} else {
			later = append(later, i)
		}
	}
	recs, cs := f.claimBatchLocked(ctx, l, q, ids, hold)
	for _, id := range ids {
		w.inflight.unlockClaim(id)
	}
	if len(later) > 0 {
		// On a connection of their own: l may hold the batch's watch.
		ol := w.lane()
		defer ol.close()
		for _, i := range later {
			r, _, _ := f.claim(ctx, ol, q, all[i], nil, false)
			recs = append(recs, r)
			cs = append(cs, buckets.ClaimState{})
		}
	}
	return recs, cs
}

// claimBatchLocked is claimBatch for ids whose claim locks the caller holds.
func (f *fetcher) claimBatchLocked(ctx context.Context, l *lane, q string, ids []string, hold bool) ([]*buckets.Record, []buckets.ClaimState) {
	w := f.w
	if len(ids) == 0 {
		return nil, nil
	}
	var bo rconn.Backoff
	cs := make([]buckets.ClaimState, len(ids))
	recs := make([]*buckets.Record, len(ids))
	for i := range cs {
		cs[i].Serves, cs[i].UnservedGrace = w.serves, w.cfg.unservedGraceMs()
	}
	if ctx.Err() != nil {
		for _, id := range ids {
			w.inflight.release(id, false)
		}
		return recs, cs
	}
	for try := 1; ; try++ {
		err := f.refreshLimits(ctx, l)
		if err == nil {
			var res []buckets.ClaimResult
			var got []*buckets.Record
			lim := f.lim.of(buckets.QueueOf(q))
			if lim.Single() {
				// A rate or a per-key limit (learnt since the pop): each
				// claim reads its windows and its key's slots.
				for i, id := range ids {
					recs[i], _, _ = f.claimLocked(ctx, l, q, id, &cs[i], false)
				}
				return recs, cs
			}
			for i := range cs {
				cs[i].Limits = lim
			}
			got, res, err = w.store.Claim(ctx, l, q, ids, cs, hold)
			if err == nil {
				for i, id := range ids {
					w.inflight.release(id, false)
					f.claimed(q, id, res[i], &cs[i])
				}
				return got, cs
			}
			if buckets.IsServerError(err) || errors.Is(err, txn.ErrConflict) {
				try = claimTries // claim each on its own
			}
		}
		if try >= claimTries || ctx.Err() != nil {
			if ctx.Err() == nil {
				w.log.Warn("could not claim a batch of tasks; claiming each on its own", keyQueue, q, keyErr, err, "tasks", len(ids))
			}
			for i, id := range ids {
				recs[i], _, _ = f.claimLocked(ctx, l, q, id, &cs[i], false)
			}
			return recs, cs
		}
		_ = bo.Wait(ctx, w.log, "claim", err)
	}
}
