package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/txn"
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
//   - several: one transaction claims them all (ClaimBatch), each runs in
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
type processor struct {
	w   *Worker
	sem chan struct{}
	// unrecorded holds a token for each result handed to the committer
	// and not yet recorded: max(Concurrency, GroupCommitMax) at most.
	unrecorded chan struct{}
	// running counts the handlers running now whose results go to the
	// committer (claimed without a watch kept for them); the committer
	// records a group at once when none is left to join it.
	running atomic.Int64
	// unchained (tests): a batch's result never takes the next batch,
	// so that a group of every slot gives them back early (nextPop).
	unchained bool
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
	for {
		select {
		case p.sem <- struct{}{}:
		case <-fetchCtx.Done():
			return
		}
		want := w.fetcher.want()
		n := 1
		if want > 1 {
			n = p.gather(want)
		}
		q, ids, ok := w.fetcher.next(fetchCtx, n)
		if !ok {
			p.release(n)
			return
		}
		p.release(n - len(ids))
		if len(ids) == 1 && (want == 1 || n > 1) {
			// One task while the queues look shallow: claimed holding
			// its record's watch, for the shortest way through.
			tasks.Go(func() {
				defer p.release(1)
				p.work(fetchCtx, baseCtx, popped{id: ids[0], q: q})
			})
			continue
		}
		tasks.Go(func() { p.batch(fetchCtx, baseCtx, &tasks, q, ids) })
	}
}

// gather takes more tokens, up to want in all, while the queues look
// deep: those free now, and those that other slots give back within
// Config.GroupCommitWindow (a group's slots are freed together), so that
// one pop takes as many tasks as it can.
// It does not wait when no other slot is taken. It returns the tokens it
// holds, the one taken before included.
func (p *processor) gather(want int) int {
	n := p.takeFree(1, want)
	window := p.w.cfg.GroupCommitWindow
	if n == want || window <= 0 || len(p.sem) == n {
		return n
	}
	t := time.NewTimer(window)
	defer t.Stop()
	for n < want && len(p.sem) > n {
		select {
		case p.sem <- struct{}{}:
			n++
		case <-t.C:
			return n
		}
	}
	// The other slots went back faster than the loop took them (a group
	// frees its slots together): take those still free.
	return p.takeFree(n, want)
}

// takeFree takes, without waiting, free tokens up to want in all, n held
// already, and returns how many it holds then.
func (p *processor) takeFree(n, want int) int {
	for n < want {
		select {
		case p.sem <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// saturated reports whether every slot is taken.
func (p *processor) saturated() bool { return len(p.sem) == cap(p.sem) }

func (p *processor) release(n int) {
	for range n {
		<-p.sem
	}
}

// work claims a popped task holding its watch, runs it, records its
// result, and goes on with the task taken together with the result, as
// long as there is one.
func (p *processor) work(fetchCtx, baseCtx context.Context, next popped) {
	w := p.w
	h := w.holder()
	defer h.Close()
	for next.id != "" {
		rec, held, waited := w.fetcher.claim(fetchCtx, h, next.q, next.id, nil, true)
		if rec == nil {
			return
		}
		var ok bool
		next, ok = p.runTask(fetchCtx, baseCtx, claimed{rec: rec, h: h, held: held, waited: waited})
		if !ok {
			return // given back while it ran
		}
		if next.id != "" && fetchCtx.Err() != nil {
			// Stopping: the id stays in the in-flight list, which the
			// worker gives back when it unregisters.
			w.inflight.release(next.id, false)
			return
		}
	}
}

// batch claims ids, popped together from queue q, in one transaction and
// runs each claimed task in a slot of its own; it holds one token per id.
// With group commit on, the claim keeps its watch for the batch's results
// (heldGroup), which this goroutine then records, and goes on with the
// batch taken with them, as long as there is one.
func (p *processor) batch(fetchCtx, baseCtx context.Context, tasks *sync.WaitGroup, q string, ids []string) {
	for len(ids) > 0 {
		q, ids = p.batchOnce(fetchCtx, baseCtx, tasks, q, ids)
	}
}

// batchOnce is one batch of batch: it returns the next, taken with its
// last result (see nextPop), with a token held for each of its ids.
func (p *processor) batchOnce(fetchCtx, baseCtx context.Context, tasks *sync.WaitGroup, q string, ids []string) (string, []string) {
	w := p.w
	h := w.holder()
	recs, cs := w.fetcher.claimBatch(fetchCtx, h, q, ids, w.finisher.group != nil)
	var held *txn.Held // the claim's watch, shared by the runs it covers
	runs := 0
	for i, rec := range recs {
		switch {
		case rec == nil:
		case cs[i].Held() != nil:
			held = cs[i].Held()
			runs++
		default:
			// Counted from now: the committer waits for them to join.
			p.running.Add(1)
		}
	}
	var group *heldGroup
	if held != nil {
		group = newHeldGroup(w, h, held, runs)
	} else {
		h.Close()
	}
	for i, rec := range recs {
		if rec == nil {
			p.release(1)
			continue
		}
		tok := &slotToken{p: p}
		tok.held.Store(true)
		c := claimed{rec: rec, tok: tok, counted: true}
		if cs[i].Held() != nil {
			c.batch, c.waited = group, cs[i].Waited()
		}
		tasks.Go(func() {
			defer tok.free()
			h := w.holder()
			defer h.Close()
			c.h = h
			if _, ok := p.runTask(fetchCtx, baseCtx, c); !ok && c.batch != nil {
				c.batch.gone()
			}
		})
	}
	if group == nil {
		return "", nil
	}
	return group.run(fetchCtx, baseCtx)
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
	want := w.fetcher.want()
	if want < cap(p.sem) || len(group) < cap(p.sem) {
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
	if n < cap(p.sem) {
		p.release(n)
		return nil
	}
	return &groupPop{q: order[0], n: n}
}

// popped ends pop, which took ids: the tokens kept for tasks it did not
// find go back, and the fetcher learns how deep the queue was.
func (p *processor) popped(pop *groupPop, ids []string) []string {
	p.release(pop.n - len(ids))
	p.w.fetcher.adapt(pop.n, len(ids))
	if len(ids) > 0 {
		p.w.chained.Add(1)
	}
	return ids
}

// runTask runs a claimed task and records its result; it returns the
// task taken with the result, if any, and false when the task was given
// back while it ran.
func (p *processor) runTask(fetchCtx, baseCtx context.Context, c claimed) (popped, bool) {
	w := p.w
	w.observeStart(c.rec)
	var result []byte
	joins := c.held == nil && c.batch == nil // its result goes to the committer
	if joins && !c.counted {
		p.running.Add(1)
	}
	herr, ok := w.runs.run(baseCtx, c.rec, &result)
	if joins {
		p.running.Add(-1)
	}
	if !ok {
		return popped{}, false
	}
	return w.finisher.finish(fetchCtx, baseCtx, c, herr, result), true
}
