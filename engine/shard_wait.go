package engine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// waitHub shares one blocking wait among the waiting parts of the lanes
// that live on one server (given the same *redis.Pool): one BLPOP on one
// connection waits on the wake-up lists of every lane's idle worker and
// every lane's dispatcher, and hands each token to the part whose list it
// came from. On Redis 2.4 a BLPOP may name keys of any number of lanes; a
// Redis Cluster pool is one per slot, so lanes there never share a hub
// (a hub there serves the dispatcher and the worker of one lane).
//
// Dispatchers subscribe once (subscribe): their wake lists stay in every
// BLPOP, and every IdleWait (a BLPOP that times out, or the first to
// return after IdleWait when tokens for other lanes keep it busy), and
// after a BLPOP that failed, every dispatcher is told to look again, as
// its own idle wait would have told it. Workers wait
// one idle wait at a time (pop). A worker that starts waiting on a list
// the BLPOP under way does not name pushes a token to the hub's own list
// ("<lane 0 prefix>hw:<uuid>", which expires an hour after its last use)
// so that the BLPOP returns and is sent again with the new keys; a worker
// that waits again on the lists it waited on before (the idle case: its
// wait timed out, and it waits again after looking) finds them in the
// BLPOP under way, and costs no command: the lists of a wait that timed
// out stay in every BLPOP for IdleWait, whatever ends a BLPOP meanwhile.
// A token that arrives for a worker that is no longer waiting is kept,
// and ends that worker's next wait at once, so no wake-up is lost between
// a worker's last look at its queues and its next wait.
type waitHub struct {
	pool    *redis.Pool
	key     string        // the hub's own wake-up list
	maxWait time.Duration // IdleWait: the longest BLPOP
	log     *slog.Logger

	// fix sets aside keys of the wrong type after a BLPOP failed on
	// one; nil: none.
	fix func(ctx context.Context, keys []string)

	mu       sync.Mutex
	waiters  map[*hubWaiter]bool  // guarded by mu
	subs     map[*hubSub]bool     // guarded by mu: the dispatchers
	kept     map[string]bool      // guarded by mu: tokens no waiter took
	blocking map[string]bool      // guarded by mu: the keys of the BLPOP under way; nil: none
	recent   map[string]time.Time // guarded by mu: keys of waiters whose wait timed out, and when, for maxWait
	started  bool                 // guarded by mu
	closed   bool                 // guarded by mu
	kick     chan struct{}        // wakes the loop when it waits for waiters
	stop     context.CancelFunc
	ctx      context.Context
	done     chan struct{}
}

type hubWaiter struct {
	keys []string
	got  chan string // buffered 1
}

// hubSub is a dispatcher's lasting wait on its wake list.
type hubSub struct {
	key  string
	wake chan struct{} // buffered 1
}

func newWaitHub(pool *redis.Pool, prefix string, maxWait time.Duration, log *slog.Logger) *waitHub {
	ctx, stop := context.WithCancel(context.Background())
	return &waitHub{pool: pool, key: prefix + "hw:" + uuid.NewString(), maxWait: maxWait, log: log,
		waiters: map[*hubWaiter]bool{}, subs: map[*hubSub]bool{}, recent: map[string]time.Time{}, kept: map[string]bool{}, kick: make(chan struct{}, 1),
		ctx: ctx, stop: stop, done: make(chan struct{})}
}

// pop waits, as rconn.Blocker.Pop does, up to wait for a token on one of
// keys: it returns the key, "" after wait, or ctx's error.
func (h *waitHub) pop(ctx context.Context, keys []string, wait time.Duration) (string, error) {
	w := &hubWaiter{keys: keys, got: make(chan string, 1)}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return "", ErrClosed
	}
	for _, k := range keys {
		if h.kept[k] {
			delete(h.kept, k)
			h.mu.Unlock()
			return k, nil
		}
	}
	h.waiters[w] = true
	interrupt := h.startLocked(keys)
	h.mu.Unlock()
	timedOut := false
	defer func() {
		h.mu.Lock()
		delete(h.waiters, w)
		select {
		case k := <-w.got:
			// Delivered as the wait ended otherwise: keep it for the
			// next wait.
			h.kept[k] = true
		default:
		}
		if timedOut {
			// It waits again on the same lists after a look: keep them
			// in the BLPOPs sent meanwhile, so that it finds them there.
			now := time.Now()
			for _, k := range keys {
				h.recent[k] = now
			}
		}
		h.mu.Unlock()
	}()
	if interrupt {
		h.interrupt(ctx)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case k := <-w.got:
		return k, nil
	case <-t.C:
		timedOut = true
		return "", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// subscribe adds key, a dispatcher's wake list, to every BLPOP of the hub
// until cancel is called. The channel gets a signal for each token on key,
// and for each BLPOP that timed out or failed (look again, as after an
// idle wait: a token may have been taken by another process, or lost
// with a connection). It reports ErrClosed after close.
func (h *waitHub) subscribe(key string) (<-chan struct{}, func(), error) {
	sub := &hubSub{key: key, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, ErrClosed
	}
	h.subs[sub] = true
	interrupt := h.startLocked([]string{key})
	h.mu.Unlock()
	if interrupt {
		h.interrupt(h.ctx)
	}
	return sub.wake, func() {
		h.mu.Lock()
		delete(h.subs, sub)
		h.mu.Unlock()
	}, nil
}

// startLocked starts the loop if needed and wakes it when it waits for
// waiters; it reports whether the BLPOP under way misses some of keys and
// must be interrupted to name them. h.mu is held.
func (h *waitHub) startLocked(keys []string) bool {
	if !h.started {
		h.started = true
		go h.run()
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
	if h.blocking == nil {
		return false
	}
	for _, k := range keys {
		if !h.blocking[k] {
			return true
		}
	}
	return false
}

// signalLocked tells every dispatcher to look again. h.mu is held.
func (h *waitHub) signalLocked() {
	for s := range h.subs {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// interrupt ends the hub's current BLPOP with a token on its own list.
func (h *waitHub) interrupt(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := h.pool.GetContext(cctx)
	if err != nil {
		return // the BLPOP fails too, or times out: the waiter's timer bounds it
	}
	defer conn.Close()
	_ = conn.Send("LPUSH", h.key, "1")
	_ = conn.Send("EXPIRE", h.key, 3600)
	_, _ = redis.DoContext(conn, cctx, "")
}

// run is the hub's loop: BLPOP on the keys of every waiting worker and
// the hub's own list, until close.
func (h *waitHub) run() {
	defer close(h.done)
	var b rconn.Blocker
	b.Pool = h.pool
	defer b.Close()
	var bo rconn.Backoff
	// The dispatchers' last look: they look again at least every
	// maxWait, however busy other lanes' lists keep the BLPOP.
	lastLook := time.Now()
	for h.ctx.Err() == nil {
		h.mu.Lock()
		var keys []string
		for w := range h.waiters {
			keys = append(keys, w.keys...)
		}
		for sub := range h.subs {
			keys = append(keys, sub.key)
		}
		if len(keys) > 0 {
			// A look between two waits can outlast a BLPOP (a token for a
			// dispatcher ends it, or a slow machine stretches the look):
			// every BLPOP within maxWait of the timeout names the lists.
			for k, at := range h.recent {
				if time.Since(at) >= h.maxWait {
					delete(h.recent, k)
					continue
				}
				keys = append(keys, k)
			}
			h.blocking = make(map[string]bool, len(keys)+1)
			for _, k := range keys {
				h.blocking[k] = true
			}
		}
		h.mu.Unlock()
		if len(keys) == 0 {
			select {
			case <-h.kick:
			case <-h.ctx.Done():
			}
			continue
		}
		slices.Sort(keys)
		keys = append(slices.Compact(keys), h.key)
		// Drain a kick sent before this BLPOP: it included the new keys.
		select {
		case <-h.kick:
		default:
		}
		wait := h.maxWait
		if rem := time.Until(lastLook.Add(h.maxWait)); rem < wait {
			wait = max(rem, time.Second)
		}
		key, err := b.Pop(h.ctx, keys, wait)
		h.mu.Lock()
		h.blocking = nil
		if err != nil || key == "" || time.Since(lastLook) >= h.maxWait {
			h.signalLocked()
			lastLook = time.Now()
		}
		h.mu.Unlock()
		if err != nil {
			if h.ctx.Err() != nil {
				return
			}
			if h.fix != nil && buckets.IsWrongType(err) {
				h.fix(h.ctx, keys)
			}
			// The waiters' own timers bound their waits meanwhile; the
			// dispatchers look again and back off on their own errors.
			if !bo.Wait(h.ctx, h.log, "shared wake-up wait", err) {
				return
			}
			continue
		}
		bo.Reset()
		if key == "" || key == h.key {
			continue
		}
		h.deliver(key)
	}
}

// deliver hands a token of key to the waiter waiting on it, or keeps it
// for that worker's next wait.
func (h *waitHub) deliver(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.key == key {
			select {
			case s.wake <- struct{}{}:
			default:
			}
			return
		}
	}
	for w := range h.waiters {
		if slices.Contains(w.keys, key) {
			select {
			case w.got <- key:
				delete(h.waiters, w)
				return
			default:
			}
		}
	}
	h.kept[key] = true
}

// close stops the loop and waits for it; waiters get ErrClosed.
func (h *waitHub) close() {
	h.mu.Lock()
	h.closed = true
	started := h.started
	h.mu.Unlock()
	h.stop()
	if started {
		<-h.done
	}
}

// popWait is the worker's blocking wait: on its lane's shared hub when it
// has one, else on its own connection.
func (wt *waiter) popWait(ctx context.Context, keys []string, wait time.Duration) (string, error) {
	if h := wt.hub; h != nil {
		return h.pop(ctx, keys, wait)
	}
	return wt.blocker.Pop(ctx, keys, wait)
}
