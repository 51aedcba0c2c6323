package engine

import (
	"context"
	"sync"
)

// processor bounds the handlers running at once with one semaphore of
// Config.Concurrency tokens: it takes a token, has the fetcher take a
// task, and runs it in a goroutine of its own, which gives the token back
// when it has no next task. A task finishing takes the next one with its
// result (one round trip); only when that finds nothing does the token go
// back to the fetching loop.
type processor struct {
	w   *Worker
	sem chan struct{}
}

// run fetches until fetchCtx ends, then waits for the running tasks.
// baseCtx is the parent of the handlers' contexts. The fetching loop only
// pops (one round trip); each task's goroutine claims it, so claims run
// in parallel.
func (p *processor) run(fetchCtx, baseCtx context.Context) {
	var tasks sync.WaitGroup
	defer tasks.Wait()
	defer p.w.fetcher.close()
	for {
		select {
		case p.sem <- struct{}{}:
		case <-fetchCtx.Done():
			return
		}
		next, ok := p.w.fetcher.next(fetchCtx)
		if !ok {
			<-p.sem
			return
		}
		tasks.Go(func() {
			defer func() { <-p.sem }()
			p.work(fetchCtx, baseCtx, next)
		})
	}
}

// work claims a popped task, runs it, records its result, and goes on
// with the task taken together with the result, as long as there is one.
func (p *processor) work(fetchCtx, baseCtx context.Context, next popped) {
	w := p.w
	h := w.holder()
	defer h.Close()
	for next.id != "" {
		rec, held := w.fetcher.claim(fetchCtx, h, next.q, next.id)
		if rec == nil {
			return
		}
		w.observeStart(rec)
		c := claimed{rec: rec, h: h, held: held}
		herr, ok := w.runs.run(baseCtx, c.rec)
		if !ok {
			return // given back while it ran
		}
		next = w.finisher.finish(fetchCtx, baseCtx, c, herr)
		if next.id != "" && fetchCtx.Err() != nil {
			// Stopping: the id stays in the in-flight list, which the
			// worker gives back when it unregisters.
			w.inflight.release(next.id, false)
			return
		}
	}
}
