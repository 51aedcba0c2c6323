package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// runner calls handlers, each under a lease timer: past its timeout plus
// LeaseGrace a handler is taken to be hung and its task is given to
// another worker. At the shutdown deadline it gives every running task
// back at once.
type runner struct {
	runnerParams
	mu      sync.Mutex
	running map[string]*activeRun // guarded by mu
	timers  sync.WaitGroup
}

// runnerParams is what a runner needs.
type runnerParams struct {
	handler   Handler
	clock     Clock // the lease timers'
	maxResult int   // Config.MaxResult
	progress  *progressWriter
	requeuer  *requeuer // gives expired and unfinished runs back
	log       *slog.Logger
}

func newRunner(p runnerParams) *runner {
	return &runner{runnerParams: p, running: map[string]*activeRun{}}
}

// Run states: a run ends either with its handler's return (the result is
// then recorded) or with being given back (the result is then dropped),
// whichever comes first.
const (
	runRunning int32 = iota
	runReturned
	runGivenBack
)

// activeRun is one run of a task: what the worker knows of it, the Task
// its handler gets, and the parent of its handler's context, which
// carries the run's result and progress boxes (SetResult, SetProgress),
// all in one allocation where a context.WithValue per box took one each.
type activeRun struct {
	context.Context // the base context the handler's is derived from
	rec             *buckets.Record
	task            Task
	cancel          context.CancelFunc
	state           atomic.Int32
	box             resultBox
	pbox            progressBox
}

// Value answers the run's boxes, and the base context's values otherwise.
func (a *activeRun) Value(key any) any {
	switch key.(type) {
	case resultKey:
		return &a.box
	case progressKey:
		return &a.pbox
	}
	return a.Context.Value(key)
}

// run calls the handler for rec and returns its error; *result gets the
// result it recorded with SetResult. ok is false when the task was given back
// before the handler returned (lease over, shutdown deadline): its result
// must not be recorded. A result that arrives before the task is given
// back is kept, even past the shutdown deadline.
func (r *runner) run(baseCtx context.Context, rec *buckets.Record, result *[]byte) (herr error, ok bool) {
	run := &activeRun{Context: baseCtx, rec: rec, task: taskOf(rec), box: resultBox{max: r.maxResult}}
	task := &run.task
	r.progress.initBox(&run.pbox, rec.ID, task.Timeout)
	hctx, cancel := context.WithTimeout(run, task.Timeout)
	defer cancel()
	run.cancel = cancel
	r.mu.Lock()
	r.running[rec.ID] = run
	r.mu.Unlock()
	r.timers.Add(1)
	timer := r.clock.AfterFunc(time.UnixMilli(rec.Deadline).Sub(r.clock.Now()), func() {
		defer r.timers.Done()
		r.expire(run)
	})

	err := callHandler(hctx, r.handler, task)
	run.pbox.close()
	returned := run.state.CompareAndSwap(runRunning, runReturned)
	if timer.Stop() {
		r.timers.Done()
	}
	r.mu.Lock()
	delete(r.running, rec.ID)
	r.mu.Unlock()
	if !returned {
		r.log.Info("handler returned after its task was given back; the task runs again",
			keyTaskID, rec.ID, keyType, rec.Type, keyErr, err)
		return nil, false
	}
	if err != nil && errors.Is(hctx.Err(), context.DeadlineExceeded) && baseCtx.Err() == nil {
		err = fmt.Errorf("timed out after %v: %w", task.Timeout, err)
	}
	*result = run.box.result
	return err, true
}

// expire gives a hung run's task back so another worker can run it. The
// handler goroutine keeps its slot until it returns.
func (r *runner) expire(run *activeRun) {
	if !run.state.CompareAndSwap(runRunning, runGivenBack) {
		return
	}
	run.cancel()
	r.log.Warn("task ran past its timeout and lease; giving it to another worker",
		keyTaskID, run.rec.ID, keyType, run.rec.Type, "timeout", time.Duration(run.rec.TimeoutMs)*time.Millisecond)
	_ = r.requeuer.requeue([]string{run.rec.ID}, buckets.LeaseExpired)
}

// giveBack returns every running task whose handler has not returned to
// the front of its queue at once (the shutdown deadline passed); the
// handlers are cancelled next. It returns the error of the return.
func (r *runner) giveBack() error {
	r.mu.Lock()
	var ids []string
	for id, run := range r.running {
		if run.state.CompareAndSwap(runRunning, runGivenBack) {
			ids = append(ids, id)
		}
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	r.log.Warn("shutdown deadline passed; returning unfinished tasks", "tasks", len(ids))
	return r.requeuer.requeue(ids, buckets.Shutdown)
}

// wait waits for the lease timers that fired.
func (r *runner) wait() { r.timers.Wait() }
