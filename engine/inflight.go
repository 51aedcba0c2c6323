package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// inflightSet knows which ids in the worker's in-flight list (f:<w>) its
// slots hold between a pop and the end of its claim. Any other id there
// was taken by a pop whose reply was lost, or given back by a claim that
// could not be made, and the recoverer returns it to its queue.
//
// gate is read-locked for the round trip of a pop and the recording of
// its id, and write-locked by the recoverer only to take a snapshot: a
// snapshot then includes every id whose pop was answered before it. Both
// locks are taken and released in one function, held for one round trip
// at most, never across a claim.
type inflightSet struct {
	gate  sync.RWMutex
	mu    sync.Mutex
	held  map[string]int           // guarded by mu
	claim map[string]chan struct{} // guarded by mu: ids a slot is claiming
	dirty atomic.Bool              // an id may have been lost: recover soon
	wake  chan struct{}            // tells the recoverer to look now
	// pops counts the pops that took ids: the only way an id enters the
	// list. The recoverer looks again only after one (or dirty).
	pops atomic.Int64
}

func newInflightSet() *inflightSet {
	return &inflightSet{held: map[string]int{}, claim: map[string]chan struct{}{}, wake: make(chan struct{}, 1)}
}

// pop runs one pop round trip (fn) and holds the id it took. A failure
// that may have lost the reply of a pop that happened marks the list for
// recovery.
func (s *inflightSet) pop(fn func() (id string, lost bool, err error)) (string, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	id, lost, err := fn()
	if id != "" {
		s.mu.Lock()
		s.held[id]++
		s.mu.Unlock()
		s.pops.Add(1)
	}
	if lost {
		s.markLost()
	}
	return id, err
}

// popMany is pop for a round trip (fn) that may take several ids.
func (s *inflightSet) popMany(fn func() (ids []string, lost bool, err error)) ([]string, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	ids, lost, err := fn()
	if len(ids) > 0 {
		s.mu.Lock()
		for _, id := range ids {
			s.held[id]++
		}
		s.mu.Unlock()
		s.pops.Add(1)
	}
	if lost {
		s.markLost()
	}
	return ids, err
}

// release ends the hold on id: its claim is over (the claim removed it
// from the list), or it is given back to the recoverer (give set).
func (s *inflightSet) release(id string, give bool) {
	s.mu.Lock()
	if s.held[id] <= 1 {
		delete(s.held, id)
	} else {
		s.held[id]--
	}
	s.mu.Unlock()
	if give {
		s.markLost()
	}
}

// tryLockClaim is lockClaim without waiting: false when another slot is
// claiming id. The claim ends with unlockClaim.
func (s *inflightSet) tryLockClaim(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.claim[id]; busy {
		return false
	}
	s.claim[id] = nil // a channel only once a slot waits (lockClaim)
	return true
}

// unlockClaim ends the claim of id that tryLockClaim or lockClaim began,
// and wakes the slots waiting for it.
func (s *inflightSet) unlockClaim(id string) {
	s.mu.Lock()
	done := s.claim[id]
	delete(s.claim, id)
	s.mu.Unlock()
	if done != nil {
		close(done)
	}
}

// lockClaim waits until no other slot of the process is claiming id, and
// then makes the caller the one that is, until it calls unlockClaim. Two
// copies of one id (a settle or a recovery may push an id twice) popped
// by two slots are claimed one after the other: two claims of one id by
// one process at once could not be told apart (a claim whose reply was
// lost, retried, would take the other's committed claim for its own) and
// the task would run twice. Claimed in turn, the second finds the task
// running, or given back, like any other copy. It returns false when ctx
// ends first. A claim nobody waits for makes no channel: almost every
// claim is of an id no other slot holds.
func (s *inflightSet) lockClaim(ctx context.Context, id string) bool {
	for {
		s.mu.Lock()
		busy, ok := s.claim[id]
		if !ok {
			s.claim[id] = nil
			s.mu.Unlock()
			return true
		}
		if busy == nil {
			busy = make(chan struct{})
			s.claim[id] = busy
		}
		s.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return false
		}
	}
}

func (s *inflightSet) markLost() {
	s.dirty.Store(true)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// snapshot waits for the pops whose replies are on their way and returns
// a copy of the held ids.
func (s *inflightSet) snapshot() map[string]int {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.held))
	for id, n := range s.held {
		out[id] = n
	}
	return out
}

// recoverer returns ids that sit in this live worker's in-flight list
// and no slot holds: at once after a lost pop reply or a claim given back,
// and otherwise at the first HeartbeatInterval tick after any pop that
// took ids, so that no id stays stranded there longer than one
// HeartbeatInterval (plus the time Redis is unreachable). It looks once
// at start too (a list left by hand is returned at once). A tick with no pop since the last look that succeeded,
// and nothing lost or given back, sends nothing: only this worker's pops
// put ids in its list, and an idle worker pops none. It never waits for
// a slot.
type recoverer struct {
	store    store
	inflight *inflightSet
	lane     func() *lane
	interval time.Duration // Config.Advanced.HeartbeatInterval
	log      *slog.Logger
}

func (r *recoverer) run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	l := r.lane()
	defer l.close()
	looked := false // a look succeeded, after seen pops
	var seen int64
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-r.inflight.wake:
			}
		}
		pops := r.inflight.pops.Load()
		if looked && pops == seen && !r.inflight.dirty.Load() {
			continue // nothing entered the list since the last look
		}
		if err := r.once(ctx, l); err != nil {
			if ctx.Err() != nil {
				return
			}
			// Not retried here: the next tick tries again.
			r.log.Warn("could not look at the in-flight list; trying again within a heartbeat interval", keyErr, err)
			r.inflight.dirty.Store(true)
			continue
		}
		looked, seen = true, pops
	}
}

// once returns every id no slot holds: three commands (WATCH, LRANGE,
// UNWATCH) when there is none.
func (r *recoverer) once(ctx context.Context, l *lane) error {
	r.inflight.dirty.Store(false)
	var total buckets.RequeueResult
	for {
		res, err := r.store.RecoverLost(ctx, l, 100, r.inflight.snapshot)
		total.Requeued += res.Requeued
		total.Buried += res.Buried
		total.Dropped += res.Dropped
		if err != nil {
			return err
		}
		if res.Requeued+res.Buried+res.Dropped < 100 {
			break
		}
	}
	if total.Requeued+total.Buried+total.Dropped > 0 {
		r.log.Warn("returned tasks left in the in-flight list (a pop reply lost or a claim given back)",
			"requeued", total.Requeued, "buried", total.Buried, "dropped", total.Dropped)
	}
	return nil
}
