package engine

import (
	"context"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// limitRead is how often, at most, the fetching loop reads its queues'
// flow control (lim:<q>), and how long a queue found full is set aside
// when no slot wake-up token comes.
const limitRead = time.Second

// limits is the worker's view of its queues' flow control (QueueConfig,
// Inspector.SetQueueLimits). The fetching loop reads it, one pipelined
// HMGET per queue, at most once per limitRead, before a pop or a claim,
// on its connection (the fetching loop's pops, and the pops sent behind
// results, all go through one); until its first read succeeds the worker
// claims nothing. The claim of a task of a queue known to be limited
// reads and takes what it needs under WATCH (buckets.Store.Claim): the
// view only says which claims must, so a limit set meanwhile is applied
// from the next read on, within a second while the worker fetches.
//
// A queue whose claim came back Full is set aside until a token arrives
// on its slot wake-up list (sw:<q>, pushed by every release of a slot),
// which the waiter blocks on, or limitRead passes; one that came back
// Throttled, until its window opens (a timed wake, timed). A key that
// came back KeyFull is out of turn in Redis until its slot is freed;
// KeyThrottled adds a timed wake for its window.
type limits struct {
	// reading is held by the one claim that reads the limits, which the
	// other claims wait for: none decides on a view older than limitRead.
	reading sync.Mutex
	mu      sync.Mutex
	read    time.Time                 // when the limits were last read; guarded by mu
	max     map[string]buckets.Limits // queue -> its flow control (absent: none); guarded by mu
	full    map[string]time.Time      // queue -> set aside until; guarded by mu
	free    map[string]int64          // queue -> slots of its limit its last claim left free; guarded by mu
	timed   map[string]time.Time      // what -> when to look again (a keyed place's next key, a throttled queue's window); guarded by mu
}

// of is queue q's flow control as last read; the zero Limits: none.
func (l *limits) of(q string) buckets.Limits {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max[q]
}

// roomAhead reports whether a worker that holds up to n tasks may claim
// ahead of its free handler slots on queues qs: a task claimed ahead
// holds a slot of its queue's concurrency limit without running, which a
// handler of another worker could have used. So only while the limit is
// far from binding: a queue without a limit, or whose flow control is a
// concurrency limit alone (a rate or a per-key limit is claimed one task
// at a time) and whose last claim here left at least n slots free.
func (l *limits) roomAhead(qs []string, n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range qs {
		lim := l.max[q]
		if !lim.Limited() {
			continue
		}
		if free, ok := l.free[q]; lim.Single() || !ok || free < int64(n) {
			return false
		}
	}
	return true
}

// noteFree notes how many slots of q's concurrency limit a claim left
// free (roomAhead).
func (l *limits) noteFree(q string, free int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.free == nil {
		l.free = map[string]int64{}
	}
	l.free[q] = free
}

// setFull sets q aside after a claim found every slot in use, or its
// window full, until until (a slot given back ends it sooner).
func (l *limits) setFull(q string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.full == nil {
		l.full = map[string]time.Time{}
	}
	l.full[q] = until
}

// wakeAt notes a time to look again at p, sooner than a blocking wait's
// second: when the next key of keyed place p comes in turn (no key's time
// had come at the last pop, or a claim put one out of turn), or when
// queue p's rate window opens. The idle wait ends then.
func (l *limits) wakeAt(p string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timed == nil {
		l.timed = map[string]time.Time{}
	}
	if old, ok := l.timed[p]; !ok || at.Before(old) || !old.After(time.Now()) {
		l.timed[p] = at
	}
}

// nextKey is the earliest time a key of any keyed place comes in turn,
// of those noted and still ahead; zero if none.
func (l *limits) nextWake(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var t time.Time
	for p, at := range l.timed {
		if !at.After(now) {
			delete(l.timed, p)
			continue
		}
		if t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// unfull ends q's set-aside: a slot was freed, or a task claimed.
func (l *limits) unfull(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.full, q)
}

// isFull reports whether q is set aside now, and until when.
func (l *limits) isFull(q string, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.full[q]
	if ok && !now.Before(until) {
		delete(l.full, q)
		return time.Time{}, false
	}
	return until, ok
}

// refreshLimits reads the limits of the worker's queues on ln when the
// last read is limitRead old. A failed read keeps the old view; it is an
// error only while there is none yet (the worker's first read): until
// then no claim may decide that a queue has no limit.
func (f *fetcher) refreshLimits(ctx context.Context, ln *lane) error {
	l := &f.lim
	due := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return time.Since(l.read) >= limitRead
	}
	if !due() {
		return nil
	}
	l.reading.Lock()
	defer l.reading.Unlock()
	if !due() {
		return nil // read by the claim waited for
	}
	now := time.Now()
	got, err := f.w.store.QueueLimits(ctx, ln, f.queues)
	if err != nil {
		if ctx.Err() == nil {
			f.w.log.Debug("could not read the queues' limits", keyErr, err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.read.IsZero() {
			return err
		}
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read = now
	l.max = make(map[string]buckets.Limits, len(got))
	for i, lim := range got {
		if lim.Limited() {
			l.max[f.queues[i]] = lim
		} else {
			delete(l.full, f.queues[i])
		}
	}
	return nil
}

// popBound is how many tasks one pop of q may take: at most its limit,
// and one for a queue with a rate or a per-key limit (Limits.Single),
// whose claim reads its windows and its key's slots one task at a time.
func (f *fetcher) popBound(q string, n int) int {
	lim := f.lim.of(q)
	if lim.Single() {
		return 1
	}
	if m := lim.MaxRunning; m > 0 && int64(n) > m {
		return int(m)
	}
	return n
}
