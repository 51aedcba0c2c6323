package engine

import (
	"context"
	"encoding/json"
	"os"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// heartbeater keeps the worker's heartbeat key alive, and tells the other
// parts whether it certainly still exists.
type heartbeater struct {
	w *Worker
	// born and lastBeat (nanoseconds since born, monotonic) tell whether
	// the heartbeat key may have expired: then a reaper may have forgotten
	// this worker, and it must not take tasks it could die with unseen.
	born     time.Time
	lastBeat atomic.Int64
	started  time.Time // on the worker's Clock, for the heartbeat info
}

func newHeartbeater(w *Worker) *heartbeater {
	return &heartbeater{w: w, born: time.Now(), started: w.cfg.Clock.Now()}
}

// register writes the first heartbeat, retrying with backoff while Redis
// cannot be reached, so that a worker started before its Redis waits. It
// returns ctx's error if ctx ends first.
func (h *heartbeater) register(ctx context.Context) error {
	bo := h.w.backoff()
	for {
		err := h.beat(ctx)
		if err == nil {
			return nil
		}
		if !bo.Wait(ctx, h.w.log, "worker registration", err) {
			return ctx.Err()
		}
	}
}

func (h *heartbeater) beat(ctx context.Context) error {
	w := h.w
	host, _ := os.Hostname()
	hb := map[string]any{
		"host": host, "pid": os.Getpid(), "queues": w.fetcher.queues,
		"concurrency": w.cfg.Concurrency, "at": w.cfg.Clock.Now().UTC().Format(time.RFC3339Nano),
		"started": h.started.UTC().Format(time.RFC3339Nano),
	}
	// The task types it serves, when its handler lists them; then its
	// heartbeat also says so for each of its queues (ty:<q>:<type>, same
	// TTL), which other workers read before giving a task back for it.
	var served []buckets.Served
	if w.types != nil {
		hb["types"] = w.types
		for _, q := range w.fetcher.queues {
			served = append(served, buckets.Served{Queue: q, Types: w.types, TTL: int64(w.cfg.HeartbeatTTL / time.Second)})
		}
	}
	info, _ := json.Marshal(hb)
	conn, err := w.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	sent := time.Since(h.born)
	if err := w.store.Beat(ctx, conn, w.id, int64(w.cfg.HeartbeatTTL/time.Second), info, served...); err != nil {
		return err
	}
	h.lastBeat.Store(int64(sent))
	return nil
}

// alive reports whether the heartbeat key certainly still exists: the
// last beat that succeeded was sent less than HeartbeatTTL minus one
// interval ago. Past that a reaper may declare this worker dead, return
// its tasks and forget it; a forgotten worker that then took a task and
// died would leave it where no reaper looks.
func (h *heartbeater) alive() bool {
	since := time.Since(h.born) - time.Duration(h.lastBeat.Load())
	return since < h.w.cfg.HeartbeatTTL-h.w.cfg.HeartbeatInterval
}

// run beats every HeartbeatInterval until ctx ends. A beat that fails is
// not retried: the next tick tries again, and alive() stops the worker
// from taking tasks once the TTL is near.
func (h *heartbeater) run(ctx context.Context) {
	w := h.w
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.beat(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			if fails == 1 || fails%10 == 0 {
				w.log.Warn("heartbeat failed; taking no tasks once the TTL is near, and running ones may be recovered elsewhere",
					keyErr, err, "ttl", w.cfg.HeartbeatTTL, "failures", fails)
			}
			continue
		}
		fails = 0
	}
}
