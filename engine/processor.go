package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
)

// processor bounds the handlers running at once with one semaphore of
// Config.Concurrency tokens, one per slot. The fetching loop takes a
// token, and more when more are free and the queues look deep (see
// fetcher.want), pops as many tasks of one queue in one round trip, and
// hands them to slots:
//
//   - one task: its goroutine claims it holding the record's watch, runs
//     it, and records its result in one round trip that also takes the
//     next task while the queues look shallow; only when that finds
//     nothing, or the queues look deep, does the token go back.
//   - several: one transaction claims them all (store.Claim), each runs in
//     its own slot, and results that end together are recorded together
//     (the committer, group commit). While the queues look deep, the
//     batch's last group pops the next batch in the same round trip as its
//     result and keeps its tokens for it (nextPop): a batch then costs
//     three round trips, its claim's two and its result's. Otherwise a
//     group's tokens go back together when it is recorded, or, when every
//     slot is taken, as its round trip starts, so the next pop and claim
//     overlap the recording. Results handed over and not yet recorded are
//     bounded (unrecorded): past the bound a slot keeps its token until
//     its result can be handed over.
//
// Claiming ahead (Config.Advanced.Prefetch): while the queues look deep and the
// handlers are quick (prefetching), the semaphore has Prefetch tokens more
// than Concurrency, so that a batch takes up to ClaimBatch tasks, and a
// second one, slots, of Concurrency tokens bounds the handlers running at
// once: a task claimed ahead waits for one of those (startRun). Otherwise
// the fetching loop holds those extra tokens itself (reserved), and at
// most Concurrency tasks are taken at a time, as without prefetch.
type processor struct {
	w     *worker
	taken tokens // Concurrency + prefetch: tasks taken, not yet recorded
	slots tokens // Concurrency: handlers running
	// reserved: tokens of taken the fetching loop holds back while it
	// does not claim ahead (its goroutine only); usable is the size of
	// taken minus them.
	reserved int
	usable   atomic.Int64
	// meanRun is the handlers' recent mean run time in nanoseconds, plus
	// one (0: none measured yet), a moving average of the last runs.
	meanRun atomic.Int64
	// freed is when a handler last gave its slot back (UnixNano; 0:
	// never): slots that are all taken and none freed for a while are
	// not quick now, whatever the mean of the runs that ended says.
	freed atomic.Int64
	// waiting counts the tasks claimed ahead waiting for a slot now.
	waiting atomic.Int64
	// unrecorded holds a token for each result handed to the committer
	// and not yet recorded: max(Concurrency + prefetch, GroupCommitMax) at
	// most.
	unrecorded tokens
	// running counts the handlers running now whose results go to the
	// committer (claimed without a watch kept for them); the committer
	// records a group at once when none is left to join it.
	running atomic.Int64
	// unchained (tests): a batch's result never takes the next batch,
	// so that a group of every slot gives them back early (nextPop).
	unchained bool

	// orderTail is closed once every task popped so far has its slot or
	// went back (nil: none popped yet): the tasks of one pop take slots
	// after those of the pops before it (reserveTurn), so that a task
	// claimed ahead does not start after one of a lower queue or priority
	// level popped after it.
	orderMu   sync.Mutex
	orderTail chan struct{} // guarded by orderMu
}

// reserveTurn gives the tasks of a pop their place after those of the
// pops before it: prev is closed once those have their slots or went
// back, and the caller closes mine once its own tasks have (passTurn). The
// fetching loop reserves once its pop returned, the pops sent behind a
// result (which take the first queue's level 1) before they are sent: a
// pop that ran first in Redis then always has the earlier place.
func (p *processor) reserveTurn() (prev, mine chan struct{}) {
	mine = make(chan struct{})
	p.orderMu.Lock()
	prev, p.orderTail = p.orderTail, mine
	p.orderMu.Unlock()
	return prev, mine
}

// passTurn closes mine once turn is closed (at once for a nil turn).
func passTurn(turn, mine chan struct{}) {
	if turn == nil {
		close(mine)
		return
	}
	select {
	case <-turn:
		close(mine)
	default:
		go func() { <-turn; close(mine) }()
	}
}

func newProcessor(w *worker) *processor {
	c, pre := w.cfg.Concurrency, w.cfg.prefetch()
	p := &processor{w: w, taken: newTokens(c + pre), slots: newTokens(c),
		unrecorded: newTokens(max(c+pre, w.cfg.Advanced.GroupCommitMax))}
	p.usable.Store(int64(c + pre))
	return p
}

// extra is how many tasks the worker may claim beyond its slots.
func (p *processor) extra() int { return p.taken.size() - p.slots.size() }

// prefetching reports whether the worker claims ahead of its free slots
// now: it takes tasks from one queue (a batch claimed ahead would bend
// the shares of weighted queues, and hold a lower queue's tasks while a
// higher one's arrive) and its last pop was of the queue's level 1 (for
// the same reason: a higher level's tasks may arrive), the queue looks deep (the next pop would ask for
// more tasks than there are slots), the handlers' mean run time, times
// the tasks claimed ahead per slot, is within Config.Advanced.PrefetchWait, and
// the slots turn over: when every one is taken, one was freed within
// PrefetchWait. The mean only counts runs that ended, so handlers that
// are all stuck in long runs would otherwise still look quick, and the
// worker would sit on tasks that another worker could start. A queue with
// flow control is claimed ahead only while its limit is far from binding
// (limits.roomAhead).
func (p *processor) prefetching() bool {
	slots, extra := p.slots.size(), p.extra()
	mean := p.meanRun.Load()
	if extra == 0 || mean == 0 || len(p.w.fetcher.queues) > 1 || p.w.fetcher.lowLevel.Load() || p.w.fetcher.want() <= slots ||
		!p.w.fetcher.lim.roomAhead(p.w.fetcher.queues, slots+extra) {
		return false
	}
	wait := p.w.cfg.Advanced.PrefetchWait
	if p.slots.all() && time.Duration(time.Now().UnixNano()-p.freed.Load()) > wait {
		return false
	}
	perSlot := (extra + slots - 1) / slots
	return time.Duration(mean-1)*time.Duration(perSlot) <= wait
}

// reserve adjusts the tokens the fetching loop holds back: none while
// prefetching, otherwise as many of the extra ones as are free now.
func (p *processor) reserve() {
	extra := p.extra()
	if extra == 0 {
		return
	}
	if p.prefetching() {
		p.taken.give(p.reserved)
		p.reserved = 0
	} else {
		p.reserved = p.taken.takeFree(p.reserved, extra)
	}
	p.usable.Store(int64(p.taken.size() - p.reserved))
}

// observeRun adds a handler's run time to the moving mean.
func (p *processor) observeRun(d time.Duration) {
	v := int64(d) + 1
	if old := p.meanRun.Load(); old != 0 {
		v = old + (v-old)/8
	}
	p.meanRun.Store(v)
}

// startRun takes a slots token for rec's handler. A task claimed ahead
// finds none free and waits for one; it goes back to the front of its
// queue unstarted (not counted as a recovery) when the worker stops
// fetching meanwhile, or when half of LeaseGrace has passed since its
// claim, so that the lease the claim set still covers its whole run. It
// takes along the runs of its batch claimed after it (claimOrder), which
// then return false at their turn without a round trip of their own.
func (p *processor) startRun(fetchCtx context.Context, c claimed) bool {
	if c.next != nil {
		defer close(c.next)
	}
	if c.turn != nil {
		<-c.turn // the batch's run before has its slot, or went back
	}
	if c.order.gone(c.idx) {
		return false // given back with a run claimed before it
	}
	rec := c.rec
	if p.slots.tryTake() {
		return true
	}
	w := p.w
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	grace := w.cfg.Advanced.LeaseGrace.Milliseconds()
	claimedAt := rec.Deadline - rec.TimeoutMs - grace // redisStore.deadline
	clock := w.cfg.Advanced.Clock
	t := clock.NewTimer(time.UnixMilli(claimedAt + grace/2).Sub(clock.Now()))
	defer t.Stop()
	if p.slots.takeBefore(fetchCtx, t.Chan()) {
		if fetchCtx.Err() == nil {
			return true
		}
		p.slots.give(1)
	}
	ids := c.order.giveBack(c.idx, rec.ID)
	w.log.Debug("tasks claimed ahead of a free slot given back unstarted", keyTaskID, rec.ID, keyQueue, rec.Queue, "tasks", len(ids), "stopping", fetchCtx.Err() != nil)
	_ = w.requeuer.requeue(ids, buckets.Unstarted)
	return false
}

// claimOrder is a batch's claim order, shared by its runs (startRun). A
// run that finds no free slot in time gives back, with itself, every run
// of its batch claimed after it: those wait for its turn, so none has
// started, and they were claimed together, so the half of LeaseGrace it
// waited is theirs too. One Requeue returns them all to the front of
// their queue in claim order, and a graceful stop costs one round trip a
// batch, not one a task, while the handlers that started run on.
type claimOrder struct {
	ids  []string     // the batch's claimed runs, in claim order
	back atomic.Int64 // index of the first run given back: len(ids) while none
}

// newClaimOrder orders the claimed runs of recs (nil: not claimed).
func newClaimOrder(recs []*buckets.Record) *claimOrder {
	o := &claimOrder{ids: make([]string, 0, len(recs))}
	for _, rec := range recs {
		if rec != nil {
			o.ids = append(o.ids, rec.ID)
		}
	}
	o.back.Store(int64(len(o.ids)))
	return o
}

// gone reports whether the run at index i was given back with one claimed
// before it. A nil *claimOrder orders nothing: never.
func (o *claimOrder) gone(i int) bool { return o != nil && int64(i) >= o.back.Load() }

// giveBack marks the run at index i, and every one after it, given back,
// and returns their ids (id alone for a nil *claimOrder). The runs after
// i read the mark after their turn, which the giver's closing of its next
// orders after the store.
func (o *claimOrder) giveBack(i int, id string) []string {
	if o == nil {
		return []string{id}
	}
	o.back.Store(int64(i))
	return o.ids[i:]
}

// run fetches until fetchCtx ends, then waits for the running tasks.
// baseCtx is the parent of the handlers' contexts.
func (p *processor) run(fetchCtx, baseCtx context.Context) {
	w := p.w
	var tasks sync.WaitGroup
	stopCommit := w.finisher.startGroup(baseCtx)
	defer stopCommit()
	defer tasks.Wait()
	defer w.fetcher.close()
	defer func() {
		// The extra tokens held back go back too: every token taken is
		// given back once.
		p.taken.give(p.reserved)
		p.reserved = 0
	}()
	for {
		p.reserve()
		if !p.taken.take(fetchCtx) {
			return
		}
		if p.reserved < p.extra() && !p.prefetching() {
			// A token a task claimed ahead gave back: held back now.
			p.reserved++
			continue
		}
		want := w.fetcher.want()
		n := 1
		if want > 1 {
			n = p.gather(want)
		}
		q, ids, ok := w.fetcher.next(fetchCtx, n, p.bound)
		if !ok {
			p.release(n)
			return
		}
		p.release(n - len(ids))
		if len(ids) == 0 {
			// The queues were empty, and by the wake every slot was
			// taken: decide again (reserve) before the next pop.
			continue
		}
		prev, mine := p.reserveTurn()
		if len(ids) == 1 && (want == 1 || n > 1) {
			// One task while the queues look shallow: claimed holding
			// its record's watch, for the shortest way through.
			tasks.Go(func() {
				defer p.release(1)
				p.work(fetchCtx, baseCtx, popped{id: ids[0], q: q, prev: prev, mine: mine})
			})
			continue
		}
		tasks.Go(func() { p.batch(fetchCtx, baseCtx, &tasks, q, ids, prev, mine) })
	}
}

// bound is how many of the n tokens the fetching loop holds it may still
// fill after the fetcher waited for an empty queue (fetcher.next): as
// many as there are slots that no other task taken holds (none: the loop
// decides again). The tokens were taken before the wait, maybe to claim
// ahead of a deep queue; the queue turned out empty, so the pop takes no
// task that would wait for a slot, and the handlers that started
// meanwhile (or were running, and block) keep theirs. The fetching loop's
// goroutine only.
func (p *processor) bound(n int) int {
	others := p.taken.out() - p.reserved - n // tokens of tasks taken: they start first
	return max(min(n, p.slots.size()-others), 0)
}

// gather takes more tokens, up to want in all, while the queues look
// deep: those free now, and those that other slots give back within
// Config.Advanced.GroupCommitWindow (a group's slots are freed together), so that
// one pop takes as many tasks as it can.
// It does not wait when no other slot is taken. It returns the tokens it
// holds, the one taken before included.
func (p *processor) gather(want int) int {
	// Others may still give tokens back while they hold some.
	others := func(n int) bool { return p.taken.out()-p.reserved > n }
	return p.taken.takeWithin(1, want, p.w.cfg.Advanced.GroupCommitWindow, others)
}

// saturated reports whether every slot is taken.
func (p *processor) saturated() bool { return p.taken.all() }

// release gives back n tokens of tasks taken.
func (p *processor) release(n int) { p.taken.give(n) }

// work claims a popped task holding its watch, runs it, records its
// result, and goes on with the task taken together with the result, as
// long as there is one. Each task takes its slot in its place in the
// order of pops (reserveTurn).
func (p *processor) work(fetchCtx, baseCtx context.Context, next popped) {
	w := p.w
	l := w.lane()
	defer l.close()
	for next.id != "" {
		rec, held, waited := w.fetcher.claim(fetchCtx, l, next.q, next.id, nil, true)
		if rec == nil {
			next.pass()
			return
		}
		c := claimed{rec: rec, l: l, held: held, waited: waited, turn: next.prev, next: next.mine}
		var ok bool
		next, ok = p.runTask(fetchCtx, baseCtx, c)
		if !ok {
			return // given back while it ran
		}
		if next.id != "" && fetchCtx.Err() != nil {
			// Stopping: the id stays in the in-flight list, which the
			// worker gives back when it unregisters.
			w.inflight.release(next.id, false)
			next.pass()
			return
		}
	}
}

// batch claims ids, popped together from queue q, in one transaction and
// runs each claimed task in a slot of its own; it holds one token per id.
// With group commit on, the claim keeps its watch for the batch's results
// (heldGroup), which this goroutine then records, and goes on with the
// batch taken with them, as long as there is one.
//
// Each batch's runs take slots after prev is closed, and close mine once
// they have theirs (reserveTurn). The batches' held groups, one after the
// other, reuse one groupChain.
func (p *processor) batch(fetchCtx, baseCtx context.Context, tasks *sync.WaitGroup, q string, ids []string, prev, mine chan struct{}) {
	var chain groupChain
	for len(ids) > 0 {
		q, ids, prev, mine = p.batchOnce(fetchCtx, baseCtx, tasks, &chain, q, ids, prev, mine)
	}
}

// batchOnce is one batch of batch: it returns the next, taken with its
// last result (see nextPop), with a token held for each of its ids.
func (p *processor) batchOnce(fetchCtx, baseCtx context.Context, tasks *sync.WaitGroup, chain *groupChain, q string, ids []string, prev, mine chan struct{}) (string, []string, chan struct{}, chan struct{}) {
	w := p.w
	l := w.lane()
	recs, cs := w.fetcher.claimBatch(fetchCtx, l, q, ids, w.finisher.group != nil)
	runs := 0 // covered by the claim's watch, left on l
	for i, rec := range recs {
		switch {
		case rec == nil:
		case cs[i].Held() != nil:
			runs++
		default:
			// Counted from now: the committer waits for them to join.
			p.running.Add(1)
		}
	}
	if n, slots := len(ids), p.slots.size(); n > slots {
		w.ahead.Add(int64(n - slots))
	}
	var group *heldGroup
	turn := prev // closed once the run before has its slot
	order := newClaimOrder(recs)
	if runs > 0 {
		group = newHeldGroup(w, l, runs, chain)
	} else {
		l.close()
	}
	idx := 0 // rec's place in order
	// One allocation holds what the runs' goroutines keep: each run, its
	// slot token and its lane.
	brs := make([]batchRun, len(recs))
	for i, rec := range recs {
		if rec == nil {
			p.release(1)
			continue
		}
		r := &brs[i]
		*r = batchRun{tok: slotToken{p: p}, lane: lane{h: rconn.Holder{Pool: w.pool}}}
		r.tok.held.Store(true)
		// The batch's runs take slots in claim order (startRun): a task
		// claimed ahead starts after those before it in its queue.
		next := make(chan struct{})
		r.c = claimed{rec: rec, l: &r.lane, tok: &r.tok, counted: true, turn: turn, next: next, order: order, idx: idx}
		idx++
		turn = next
		if cs[i].Held() != nil {
			r.c.batch, r.c.waited = group, cs[i].Waited()
		}
		tasks.Add(1)
		go p.runBatched(fetchCtx, baseCtx, tasks, r)
	}
	if mine != nil {
		passTurn(turn, mine) // the pops after this one's wait for its last run
	}
	if group == nil {
		return "", nil, nil, nil
	}
	return group.run(fetchCtx, baseCtx)
}

// runBatched is the goroutine of r, one run of a claimed batch. A go
// statement, where tasks.Go would take a closure: one allocation a task
// less.
func (p *processor) runBatched(fetchCtx, baseCtx context.Context, tasks *sync.WaitGroup, r *batchRun) {
	defer tasks.Done()
	defer r.tok.free()
	defer r.lane.close()
	if _, ok := p.runTask(fetchCtx, baseCtx, r.c); !ok && r.c.batch != nil {
		r.c.batch.gone()
	}
}

// batchRun is what the goroutine of one run of a claimed batch keeps.
type batchRun struct {
	c    claimed
	tok  slotToken
	lane lane
}

// slotToken is a batch run's slot token, which goes back once: when the
// run ends or its group gives it back (free), unless its group took it
// over for the next batch first (keep). A nil *slotToken is no token:
// free does nothing and keep reports false.
type slotToken struct {
	p    *processor
	held atomic.Bool
}

func (t *slotToken) free() {
	if t.keep() {
		t.p.release(1)
	}
}

func (t *slotToken) keep() bool { return t != nil && t.held.CompareAndSwap(true, false) }

// nextPop decides whether a batch's last group, about to be recorded with
// the watch its claim kept, takes the next batch in the same round trip:
// when the group holds every slot of the worker and the queues look deep
// enough for a pop of that many (and the worker is fetching and its
// heartbeats succeed), it keeps the group's slot tokens for as many tasks
// of the first queue in the fetch order, which respects priorities as
// the fetching loop's pop does. It returns nil, keeping nothing,
// otherwise: then the group gives its slots back as its round trip starts
// (recordGroup), and the fetching loop's pop overlaps it.
//
// Only a group of every slot takes the next batch: the fetching loop
// then waits for a token, and no other pop of the worker can run between
// the next batch's claim's WATCH of the in-flight list and its EXEC.
// Batches of part of the slots, each taking its own next, void each
// other's claims.
func (p *processor) nextPop(fetchCtx context.Context, group []commitReq) *groupPop {
	w := p.w
	if p.unchained || fetchCtx.Err() != nil || !w.hb.alive() || w.fetcher.shallow() {
		return nil
	}
	want, usable := w.fetcher.want(), int(p.usable.Load())
	if want < usable || len(group) < usable {
		return nil
	}
	order := w.fetcher.order()
	if len(order) == 0 {
		return nil
	}
	n := 0
	for _, r := range group {
		if r.tok.keep() {
			n++
		}
	}
	if n < usable {
		p.release(n)
		return nil
	}
	if b := w.fetcher.popBound(order[0], n); b < n {
		p.release(n - b) // a limited queue: no more than its limit at once
		n = b
	}
	prev, mine := p.reserveTurn() // before the pop is sent
	return &groupPop{q: order[0], n: n, prev: prev, mine: mine}
}

// popped ends pop, which took ids: the tokens kept for tasks it did not
// find go back, and the fetcher learns how deep the queue was.
func (p *processor) popped(pop *groupPop, ids []string) []string {
	p.release(pop.n - len(ids))
	p.w.fetcher.adapt(pop.n, len(ids))
	if len(ids) > 0 {
		p.w.chained.Add(1)
	} else {
		passTurn(pop.prev, pop.mine)
	}
	return ids
}

// runTask runs a claimed task and records its result; it returns the
// task taken with the result, if any, and false when the task was given
// back while it ran.
func (p *processor) runTask(fetchCtx, baseCtx context.Context, c claimed) (popped, bool) {
	w := p.w
	joins := !c.held && c.batch == nil // its result goes to the committer
	if !p.startRun(fetchCtx, c) {
		if joins && c.counted {
			p.running.Add(-1)
		}
		return popped{}, false
	}
	w.observeStart(c.rec)
	var result []byte
	if joins && !c.counted {
		p.running.Add(1)
	}
	start := time.Now()
	herr, ok := w.runs.run(baseCtx, c.rec, &result)
	p.slots.give(1)
	end := time.Now()
	p.freed.Store(end.UnixNano())
	p.observeRun(end.Sub(start))
	if joins {
		p.running.Add(-1)
	}
	if !ok {
		return popped{}, false
	}
	return w.finisher.finish(fetchCtx, baseCtx, c, herr, result), true
}
