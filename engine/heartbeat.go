package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
)

// heartbeater keeps the worker's heartbeat key alive, and tells the other
// parts whether it certainly still exists.
//
// A beat is a full one (buckets.Store.Beat: it also adds the worker to
// the registry and removes its types from the unserved hashes) when the
// heartbeat key may have expired since the last beat, and about once per
// HeartbeatTTL; otherwise it only renews the keys' TTLs
// (buckets.Store.Refresh: one SETEX without served types). A key that
// never expired means no reaper can have forgotten the worker (Forget
// requires it gone), so the registry still holds it.
type heartbeater struct {
	heartbeatParams
	// types the worker serves (sorted; nil: every type), set once at
	// start (serve), before the first beat.
	types []string
	// born and lastBeat (nanoseconds since born, monotonic) tell whether
	// the heartbeat key may have expired: then a reaper may have forgotten
	// this worker, and it must not take tasks it could die with unseen.
	born     time.Time
	lastBeat atomic.Int64
	started  time.Time // on the worker's Clock, for the heartbeat info
	// lastFull is when the last full beat that succeeded was sent
	// (nanoseconds since born); full forces the next beat to be full.
	// Touched only by the goroutine that beats (register, then run).
	lastFull time.Duration
	full     bool
}

// heartbeatParams is what a heartbeater needs.
type heartbeatParams struct {
	store         store
	ttl, interval time.Duration // Config.Advanced.HeartbeatTTL, HeartbeatInterval
	clock         Clock         // the engine's, for the heartbeat info
	// beats is what beats and the TTL reckoning run on: real time in a
	// worker, since Redis times the key's TTL on its own clock; a unit
	// test drives a fake one.
	beats       Clock
	queues      []string // the worker's, for the heartbeat info
	concurrency int
	log         *slog.Logger
}

func newHeartbeater(p heartbeatParams) *heartbeater {
	return &heartbeater{heartbeatParams: p, born: p.beats.Now(), started: p.clock.Now(), full: true}
}

// serve says which task types the worker serves (nil: every type), for
// its heartbeat.
func (h *heartbeater) serve(types []string) { h.types = types }

// register writes the first heartbeat, retrying with backoff while Redis
// cannot be reached, so that a worker started before its Redis waits. It
// returns ctx's error if ctx ends first.
func (h *heartbeater) register(ctx context.Context) error {
	var bo rconn.Backoff
	for {
		err := h.beat(ctx)
		if err == nil {
			return nil
		}
		if !bo.Wait(ctx, h.log, "worker registration", err) {
			return ctx.Err()
		}
	}
}

// expirySlack is kept between a renewal and the earliest moment the key
// it renews can expire: Redis 2.4 keeps expiry times in whole seconds.
const expirySlack = time.Second

// beat sends one beat: a full one when needFull says so, otherwise a
// renewal. A renewal whose reply came so late that the key might have
// expired before it ran is followed at once by a full beat.
func (h *heartbeater) beat(ctx context.Context) error {
	for {
		sent := h.beats.Since(h.born)
		full := h.needFull(sent)
		if err := h.send(ctx, full); err != nil {
			h.full = true
			return err
		}
		if !full && h.beats.Since(h.born)-time.Duration(h.lastBeat.Load()) >= h.ttl-expirySlack {
			h.full = true // it may have run after the key expired: register again
			continue
		}
		h.lastBeat.Store(int64(sent))
		if full {
			h.full, h.lastFull = false, sent
		}
		return nil
	}
}

// needFull reports whether the beat sent at sent (since born) must be a
// full one: the first, one after a failure, one sent when the key may
// have expired, and the first one sent once HeartbeatTTL less half an
// interval has passed since the last full one: about one full beat per
// HeartbeatTTL (within half an interval), so that a registry or an
// unserved hash changed by hand is put right within that.
func (h *heartbeater) needFull(sent time.Duration) bool {
	return h.full || sent-time.Duration(h.lastBeat.Load()) >= h.ttl-expirySlack ||
		sent-h.lastFull >= h.ttl-h.interval/2
}

// send writes the heartbeat: full (Beat) or a renewal (Refresh).
func (h *heartbeater) send(ctx context.Context, full bool) error {
	host, _ := os.Hostname()
	hb := map[string]any{
		"host": host, "pid": os.Getpid(), "queues": h.queues,
		"concurrency": h.concurrency, "at": h.clock.Now().UTC().Format(time.RFC3339Nano),
		"started": h.started.UTC().Format(time.RFC3339Nano),
	}
	// The task types it serves, when its handler lists them; then its
	// heartbeat also says so for each of its queues (ty:<q>:<type>, same
	// TTL), which other workers read before giving a task back for it.
	ttl := int64(h.ttl / time.Second)
	var served []buckets.Served
	if h.types != nil {
		hb["types"] = h.types
		for _, q := range h.queues {
			served = append(served, buckets.Served{Queue: q, Types: h.types, TTL: ttl})
		}
	}
	info, _ := json.Marshal(hb)
	return h.store.Beat(ctx, nil, beat{full: full, ttl: ttl, info: info, served: served})
}

// alive reports whether the heartbeat key certainly still exists: the
// last beat that succeeded was sent less than HeartbeatTTL minus one
// interval ago. Past that a reaper may declare this worker dead, return
// its tasks and forget it; a forgotten worker that then took a task and
// died would leave it where no reaper looks.
func (h *heartbeater) alive() bool {
	since := h.beats.Since(h.born) - time.Duration(h.lastBeat.Load())
	return since < h.ttl-h.interval
}

// run beats every HeartbeatInterval until ctx ends. A beat that fails is
// not retried: the next tick tries again, and alive() stops the worker
// from taking tasks once the TTL is near.
func (h *heartbeater) run(ctx context.Context) {
	t := h.beats.NewTicker(h.interval)
	defer t.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if err := h.beat(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			if fails == 1 || fails%10 == 0 {
				h.log.Warn("heartbeat failed; taking no tasks once the TTL is near, and running ones may be recovered elsewhere",
					keyErr, err, "ttl", h.ttl, "failures", fails)
			}
			continue
		}
		fails = 0
		storePlaceAgain(ctx, h.store, h.log)
	}
}
