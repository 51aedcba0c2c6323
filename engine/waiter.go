package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
)

// waiter blocks, while the worker has a free slot and every queue it may
// take from is empty, in BLPOP on the wake-up lists of the queues that are
// neither paused nor skipped, on a connection of its own, until a producer
// pushes a token, IdleWait passes, or the paused queues change (a resume
// ends the wait at once). When every queue is paused or skipped it blocks
// on nothing in Redis: it waits for a change, the end of a skip, or
// IdleWait. A wait that times out re-reads the paused set while one of
// the worker's queues is paused as far as it knows, so that a lost resume
// costs at most one idle wait. A lost pause needs no re-read: the claim
// reads the paused set under WATCH, gives the task back and marks the
// queue paused.
//
// A queue set aside because a claim found every slot of its concurrency
// limit in use (limits.go) is waited on by its slot wake-up list sw:<q>
// instead of n:<q>: a slot given back anywhere wakes the worker at once,
// and the set-aside ends, at the latest, within a second. A rate window
// that opens, or a key whose turn comes, sooner than that (limits.wakeAt)
// is waited for with a timer instead.
type waiter struct {
	waiterParams
	blocker rconn.Blocker
	bo      rconn.Backoff
}

// waiterParams is what a waiter needs besides the fetcher it waits for
// (its queues, skips and limits).
type waiterParams struct {
	f        *fetcher
	control  *control
	store    store // sets aside a wake-up list of the wrong type
	keys     buckets.Keys
	idleWait time.Duration // Config.Advanced.IdleWait
	hub      *waitHub      // the sharded client's shared wait, if any
	log      *slog.Logger
}

// wait returns when a token arrived, IdleWait passed, the paused queues
// changed, or after a failure (with backoff); false when ctx ended.
func (wt *waiter) wait(ctx context.Context) bool {
	f := wt.f
	changed := wt.control.watch()
	now := time.Now()
	var keys []string
	var wake time.Time // the earliest end of a skip
	slotKeys := map[string]string{}
	for _, q := range f.queues {
		if wt.control.isPaused(q) {
			continue
		}
		if until, full := f.lim.isFull(q, now); full {
			if wake.IsZero() || until.Before(wake) {
				wake = until
			}
			k := wt.keys.SlotWake(q)
			keys = append(keys, k)
			slotKeys[k] = q
			continue
		}
		if until, skip := f.skipped(q, now); skip {
			if wake.IsZero() || until.Before(wake) {
				wake = until
			}
			continue
		}
		keys = append(keys, wt.keys.Notify(q))
	}
	tw := f.lim.nextWake(now) // a key comes in turn, or a rate window opens
	if !tw.IsZero() && (wake.IsZero() || tw.Before(wake)) {
		wake = tw
	}
	if len(keys) == 0 || !tw.IsZero() && time.Until(tw) < time.Second {
		// Nothing to block on, or something to look at sooner than
		// BLPOP's one-second timeout: a timer, then look.
		d := wt.idleWait
		if !wake.IsZero() {
			d = min(d, time.Until(wake))
		}
		t := time.NewTimer(max(d, 0))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-t.C:
			if wake.IsZero() {
				wt.reread(ctx)
			}
		}
		return true
	}
	wait := wt.idleWait
	if !wake.IsZero() {
		wait = time.Second // a skip ends within the second: look again then
	}
	bctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-changed:
			cancel()
		case <-bctx.Done():
		}
	}()
	key, err := wt.popWait(bctx, keys, wait) // shard_wait.go
	cancel()
	if err == nil {
		wt.bo.Reset()
		if q, ok := slotKeys[key]; ok {
			f.lim.unfull(q) // a slot was given back: try again
		}
		if key == "" && wake.IsZero() {
			wt.reread(ctx)
		}
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	if bctx.Err() != nil {
		return true // the paused queues changed: look again
	}
	if buckets.IsWrongType(err) {
		// A wake-up list of the wrong type: set it aside, and look at
		// the queues meanwhile. Other error replies (a cluster that is
		// down, a server still loading its data) are waited out.
		wt.store.SetAside(ctx, "list", keys...)
	}
	// A failed wait must not become a poll: back off.
	return wt.bo.Wait(ctx, wt.log, "worker wake-up wait", err)
}

// reread re-reads the paused set after an idle wait timed out, when one
// of the worker's queues is paused: only a resume can have been missed
// to any effect.
func (wt *waiter) reread(ctx context.Context) {
	if !wt.control.anyPaused(wt.f.queues) {
		return
	}
	if err := wt.control.reread(ctx); err != nil && ctx.Err() == nil {
		wt.log.Warn("could not re-read the paused queues; the control channel still tells", keyErr, err)
	}
}

func (wt *waiter) close() { wt.blocker.Close() }
