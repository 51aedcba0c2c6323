package engine

import (
	"context"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// committer records the results of runs that end together in one
// transaction and one round trip (group commit, buckets.FinishGroup). A
// run hands its result over and waits for the group's answer; its slot
// is free for the next task when the group is recorded, or as its round
// trip starts when every slot of the worker is taken. The first result
// of a group waits at most Config.Advanced.GroupCommitWindow for others, and not
// at all when no other handler of the process whose result would come
// here is running (nobody could join) or GroupCommitMax results are
// waiting: under load the results that arrive while a group is being
// recorded form the next one.
//
// Only results of tasks claimed in a batch whose watch was not kept come
// here (a workflow member's, or every batch's when the claim fell back to
// one task at a time); a task claimed on its own records its result with
// the watch its claim left (store.Finish with held), and a batch whose claim left its
// watch records its runs' results with it (heldGroup).
type committer struct {
	w    *worker
	reqs chan commitReq
	stop chan struct{}
	done chan struct{}
}

type commitReq struct {
	item  finishItem
	tok   *slotToken // the run's slot token; nil: none
	reply chan commitRes
	// gone (a heldGroup's): the run was given back and no result comes.
	gone bool
}

type commitRes struct {
	res  buckets.FinishResult
	err  error // the group failed as a whole
	sent bool  // and its transaction may have run
}

// groupCommitTimeout bounds one group's round trips.
const groupCommitTimeout = 10 * time.Second

// startGroup starts the committer when group commit is on, with baseCtx
// as the parent of its round trips' contexts, and returns the function
// that stops it once no slot will hand it a result any more.
func (f *finisher) startGroup(baseCtx context.Context) func() {
	if f.w.cfg.Advanced.GroupCommitWindow < 0 {
		return func() {}
	}
	c := &committer{w: f.w, reqs: make(chan commitReq), stop: make(chan struct{}), done: make(chan struct{})}
	f.group = c
	go c.run(baseCtx)
	return func() {
		close(c.stop)
		<-c.done
		f.group = nil
	}
}

// commit hands item to the committer and waits for its group's answer.
// A group error comes with sent set when the transaction may have run.
//
// tok, when given, is the run's slot token, given back with all of a
// group's slots at once so that the fetching loop finds them free together
// and takes as many tasks: before the group's round trip when no slot of
// the worker is free (the loop waits for them), after it otherwise.
func (c *committer) commit(item finishItem, tok *slotToken) (res buckets.FinishResult, sent bool, err error) {
	return askCommit(c.reqs, item, tok)
}

// replies recycles the channels on which a result's group answers: one
// answer comes on each, and it is taken before the channel goes back, so
// a channel from the pool is empty. Made per result, they were one of the
// allocations of every task.
var replies = sync.Pool{New: func() any { return make(chan commitRes, 1) }}

// askCommit sends item to a group's requests and waits for its answer.
func askCommit(reqs chan<- commitReq, item finishItem, tok *slotToken) (buckets.FinishResult, bool, error) {
	reply := replies.Get().(chan commitRes)
	reqs <- commitReq{item: item, tok: tok, reply: reply}
	r := <-reply
	replies.Put(reply)
	return r.res, r.sent, r.err
}

func (c *committer) run(baseCtx context.Context) {
	defer close(c.done)
	w := c.w
	l := w.lane()
	defer l.close()
	window, most := w.cfg.Advanced.GroupCommitWindow, w.cfg.Advanced.GroupCommitMax
	var timer groupTimer
	for {
		var group []commitReq
		select {
		case r := <-c.reqs:
			group = append(group, r)
		case <-c.stop:
			return
		}
		var expire <-chan time.Time
	gather:
		for len(group) < most {
			select {
			case r := <-c.reqs:
				group = append(group, r)
				continue
			default:
			}
			if window <= 0 || w.proc.running.Load() == 0 {
				break // nobody left to join
			}
			if expire == nil {
				expire = timer.start(window)
			}
			select {
			case r := <-c.reqs:
				group = append(group, r)
			case <-expire:
				expire = nil
				break gather
			}
		}
		timer.stop(expire)
		recordGroup(baseCtx, w, l, false, group, nil)
	}
}

// groupPop is the pop of the next batch that a batch's last group sends
// behind its EXEC (see processor.nextPop): n tasks of queue q, one for
// each slot token the group kept.
type groupPop struct {
	q string
	n int
	// prev and mine are the pop's place in the slot order
	// (processor.reserveTurn), taken before it is sent.
	prev, mine chan struct{}
}

// recordGroup records a group's results in one transaction on l and
// answers each of its slots: with held, with the watch a batch claim left
// on l (covering every run of the group) when it still holds (store.Finish).
//
// pop, when given with held, is sent behind the group's EXEC in the same
// round trip; recordGroup returns the ids it took, which the in-flight
// set holds for the caller's claim (none when the round trip failed: a
// pop that ran is then the recoverer's).
func recordGroup(baseCtx context.Context, w *worker, l *lane, held bool, group []commitReq, pop *groupPop) (ids []string) {
	ctx, cancel := context.WithTimeout(baseCtx, groupCommitTimeout)
	defer cancel()
	// Every slot waiting on this group: the fetching loop has nothing to
	// do until they are free, so they go back now and the next pop and
	// claim overlap this round trip. Otherwise they go back once it is
	// done, which keeps the pops of a shallow backlog from shrinking to
	// the few slots freed at a time.
	early := w.proc.saturated()
	if early {
		freeAll(group)
	}
	req := finishReq{items: make([]finishItem, len(group)), held: held}
	for i, r := range group {
		req.items[i] = r.item
	}
	var (
		res finishRes
		err error
	)
	if held && pop != nil {
		req.pop, req.popN = pop.q, pop.n
		ids, _ = w.inflight.popMany(func() ([]string, bool, error) {
			res, err = w.store.Finish(ctx, l, req)
			return res.popped, res.popLost, nil
		})
	} else {
		res, err = w.store.Finish(ctx, l, req)
	}
	if !early {
		freeAll(group)
	}
	for i, r := range group {
		if err != nil {
			r.reply <- commitRes{err: err, sent: res.sent}
			continue
		}
		r.reply <- commitRes{res: res.results[i]}
	}
	return ids
}

// heldGroup records the results of the runs of one batch whose claim left
// its watch on the batch's lane (Claim with hold): the first group of
// them that ends together is recorded with that watch, in one round trip
// and without reading the records again; any later group of the batch,
// or every group when a record changed since the claim, the checked way
// (store.Finish). The first result waits
// for the batch's others at most Config.Advanced.GroupCommitWindow, as the
// committer's. It runs on the batch's goroutine until each of its runs has
// reported, with its result or as given back (gone). While the queues look
// deep, the group recorded with the watch, when it is the batch's last,
// takes the next batch with its result (processor.nextPop).
type heldGroup struct {
	w     *worker
	l     *lane       // the claim's lane, with the watch
	held  bool        // the watch is not used yet
	left  int         // runs not yet reported
	chain *groupChain // its requests' channel among what it reuses
}

// groupChain is what the held groups of one chain of batches (processor.batch)
// reuse, one group after the other: the requests' channel (empty once a
// group has run: every run reports once), the list a group is gathered
// in, and the window's timer.
type groupChain struct {
	reqs  chan commitReq
	group []commitReq
	timer groupTimer
}

func newHeldGroup(w *worker, l *lane, runs int, chain *groupChain) *heldGroup {
	if cap(chain.reqs) < runs {
		chain.reqs = make(chan commitReq, max(runs, 2*cap(chain.reqs)))
	}
	return &heldGroup{w: w, l: l, held: true, left: runs, chain: chain}
}

// commit hands a run's result to the group and waits for its answer, as
// committer.commit.
func (g *heldGroup) commit(item finishItem, tok *slotToken) (res buckets.FinishResult, sent bool, err error) {
	return askCommit(g.chain.reqs, item, tok)
}

// gone tells the group that a run was given back: no result comes.
func (g *heldGroup) gone() { g.chain.reqs <- commitReq{gone: true} }

// run records the batch's results as they come, then closes the batch's
// connection (the pool unwatches a watch left unused). It returns the
// next batch, taken with the last group's result: its queue and ids, for
// which it holds a slot token each (none: nothing was taken), and its
// place in the slot order (processor.reserveTurn).
func (g *heldGroup) run(fetchCtx, baseCtx context.Context) (string, []string, chan struct{}, chan struct{}) {
	defer g.l.close()
	window := g.w.cfg.Advanced.GroupCommitWindow
	timer := &g.chain.timer
	for g.left > 0 {
		// recordGroup keeps nothing of group: the next reuses its array.
		group := g.chain.group[:0]
		take := func(r commitReq) {
			g.left--
			if !r.gone {
				group = append(group, r)
			}
		}
		take(<-g.chain.reqs)
		var expire <-chan time.Time
	gather:
		for g.left > 0 {
			select {
			case r := <-g.chain.reqs:
				take(r)
				continue
			default:
			}
			if len(group) == 0 {
				take(<-g.chain.reqs) // only runs given back so far
				continue
			}
			if window <= 0 {
				break
			}
			if expire == nil {
				expire = timer.start(window)
			}
			select {
			case r := <-g.chain.reqs:
				take(r)
			case <-expire:
				expire = nil
				break gather
			}
		}
		timer.stop(expire)
		g.chain.group = group
		if len(group) == 0 {
			continue
		}
		held := g.held
		g.held = false
		var pop *groupPop
		if g.left == 0 && held {
			pop = g.w.proc.nextPop(fetchCtx, group)
		}
		ids := recordGroup(baseCtx, g.w, g.l, held, group, pop)
		if pop != nil {
			if ids = g.w.proc.popped(pop, ids); len(ids) == 0 {
				return "", nil, nil, nil
			}
			return pop.q, ids, pop.prev, pop.mine
		}
	}
	return "", nil, nil, nil
}

// groupTimer is the window a group's first result waits for others in:
// one time.Timer, armed again for each group.
type groupTimer struct{ t *time.Timer }

// start arms the timer for d and returns its channel.
func (g *groupTimer) start(d time.Duration) <-chan time.Time {
	if g.t == nil {
		g.t = time.NewTimer(d)
	} else {
		g.t.Reset(d)
	}
	return g.t.C
}

// stop disarms the timer when it was started (expire, start's channel,
// not nil) and has not been received from.
func (g *groupTimer) stop(expire <-chan time.Time) {
	if expire != nil && !g.t.Stop() {
		<-g.t.C
	}
}

// freeAll gives back the slots of a group's runs.
func freeAll(group []commitReq) {
	for _, r := range group {
		r.tok.free()
	}
}
