package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
)

// The workflow scenario's processes: a producer of chains and groups
// (-mode flow-producer) and the handlers of their tasks, which every
// worker serves.
var flowOpts struct {
	chains, steps, groups, members, from int
}

func init() {
	flag.IntVar(&flowOpts.chains, "chains", 0, "flow-producer: chains to enqueue (ids c0, c1, ...)")
	flag.IntVar(&flowOpts.steps, "steps", 5, "flow-producer: steps per chain")
	flag.IntVar(&flowOpts.groups, "groups", 0, "flow-producer: groups to enqueue (ids g0, g1, ...)")
	flag.IntVar(&flowOpts.members, "members", 50, "flow-producer: members per group")
	flag.IntVar(&flowOpts.from, "flow-from", 0, "flow-producer: skip this many workflows (chains first, then groups): acknowledged by an earlier incarnation")
}

// Flow task types and what their handlers check.
const (
	flowStep     = "flow.step"
	flowMember   = "flow.member"
	flowCallback = "flow.cb"
	// FlowCheck starts the error logged by a handler that finds a
	// workflow's data wrong; the harness fails the run on it.
	flowCheck = "flowcheck"
)

// flowFails says whether member i of a group dies on its first run: one
// in ten, so that both group policies meet dead members.
func flowFails(i int) bool { return i%10 == 7 }

// flowClient enqueues workflows: an *engine.Client, or an
// *engine.ShardedClient (a workflow in the lane its id hashes to).
type flowClient interface {
	EnqueueChain(ctx context.Context, id string, steps ...engine.Step) (*engine.WorkflowInfo, error)
	EnqueueGroup(ctx context.Context, g engine.Group) (*engine.WorkflowInfo, error)
}

// produceFlows enqueues chains c0..c<n> and groups g0..g<m> in order,
// each until it is written or found written (ErrTaskExists: an earlier
// incarnation, or this one after a lost reply, wrote it), and appends
// "W <id>" to the ledger once it is acknowledged. A restarted producer
// starts from the first workflow its predecessors had not acknowledged
// (-flow-from). Even groups run the callback whatever
// the members' outcomes; odd ones fail while a member is dead.
func produceFlows(ctx context.Context, client flowClient, o options, log *slog.Logger) error {
	if o.ledgerPath == "" {
		return errors.New("flow-producer needs -ledger")
	}
	led, err := ledger.Create(o.ledgerPath)
	if err != nil {
		return err
	}
	defer led.Close()
	enqueue := func(id string, f func(ctx context.Context) error) error {
		for try := 0; ctx.Err() == nil; try++ {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := f(cctx)
			cancel()
			if err == nil || errors.Is(err, engine.ErrTaskExists) {
				return led.Write("W " + id)
			}
			if try < 5 || try%50 == 0 {
				log.Warn("enqueue of a workflow failed; retrying with its id", "workflow", id, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(50+20*min(try, 20)) * time.Millisecond):
			}
		}
		return nil
	}
	for i := flowOpts.from; i < flowOpts.chains; i++ {
		id := fmt.Sprintf("c%d", i)
		steps := make([]engine.Step, flowOpts.steps)
		for j := range steps {
			steps[j] = engine.Step{Type: flowStep, PassResult: j > 0}
			if j == 2 {
				steps[j].Delay = 150 * time.Millisecond // through a bucket and a dispatcher
			}
		}
		if err := enqueue(id, func(ctx context.Context) error { _, err := client.EnqueueChain(ctx, id, steps...); return err }); err != nil {
			return err
		}
	}
	for i := max(flowOpts.from-flowOpts.chains, 0); i < flowOpts.groups; i++ {
		id := fmt.Sprintf("g%d", i)
		g := engine.Group{ID: id, Members: make([]engine.Step, flowOpts.members),
			Callback: &engine.Step{Type: flowCallback, Delay: 100 * time.Millisecond}, ContinueOnFailure: true}
		if i%2 == 1 {
			g.ContinueOnFailure = false
		}
		for j := range g.Members {
			g.Members[j] = engine.Step{Type: flowMember}
		}
		if err := enqueue(id, func(ctx context.Context) error { _, err := client.EnqueueGroup(ctx, g); return err }); err != nil {
			return err
		}
	}
	if err := led.Sync(); err != nil {
		return err
	}
	log.Info("flow producer done", "chains", flowOpts.chains, "groups", flowOpts.groups)
	return nil
}

// flowHandlers registers the workflow handlers on mux. Each appends its
// start (the payload word is "r<run>", so that a task written twice shows
// two first runs) and end to the ledger, sleeps like the noop handler,
// and checks what the workflow gave it, logging flowcheck errors.
func flowHandlers(mux *engine.Mux, led *ledger.Writer, sleep func() time.Duration, log *slog.Logger) {
	pid := os.Getpid()
	wrap := func(check func(ctx context.Context, t *engine.Task) error) func(context.Context, *engine.Task) error {
		return func(ctx context.Context, t *engine.Task) error {
			if err := led.Write(ledger.Start(ledger.Run{ID: t.ID, Start: time.Now().UnixMilli(), PID: pid, Payload: fmt.Sprintf("r%d", t.Run),
				Attempt: t.Attempt, Recoveries: t.Recoveries, Due: t.Due.UnixMilli(), Key: t.Key, Claimed: t.Started.UnixMilli()})); err != nil {
				return err
			}
			tm := time.NewTimer(sleep())
			defer tm.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tm.C:
			}
			if err := check(ctx, t); err != nil {
				return err
			}
			return led.Write(ledger.End(t.ID, time.Now().UnixMilli(), pid))
		}
	}
	bad := func(t *engine.Task, format string, args ...any) {
		log.Error(flowCheck+": "+fmt.Sprintf(format, args...), "task", t.ID)
	}
	mux.HandleFunc(flowStep, wrap(func(ctx context.Context, t *engine.Task) error {
		w := t.Workflow
		if w == nil || w.Kind != "chain" || t.ID != fmt.Sprintf("%s~%d", w.ID, w.Index) {
			bad(t, "a chain step without its chain: %+v", w)
			return nil
		}
		if want := fmt.Sprintf("%s:%d", w.ID, w.Index-1); w.Index > 0 && string(w.Input) != want {
			bad(t, "input %q, want its predecessor's result %q", w.Input, want)
		}
		return engine.SetResult(ctx, []byte(fmt.Sprintf("%s:%d", w.ID, w.Index)))
	}))
	mux.HandleFunc(flowMember, wrap(func(ctx context.Context, t *engine.Task) error {
		w := t.Workflow
		if w == nil || w.Kind != "group" || w.Callback {
			bad(t, "a member without its group: %+v", w)
			return nil
		}
		if flowFails(w.Index) && t.Run == 1 {
			return engine.Permanent(errors.New("member fails on its first run"))
		}
		return engine.SetResult(ctx, []byte(fmt.Sprintf("%s:%d", w.ID, w.Index)))
	}))
	mux.HandleFunc(flowCallback, wrap(func(_ context.Context, t *engine.Task) error {
		w := t.Workflow
		if w == nil || !w.Callback || len(w.Outcomes) != w.Total {
			bad(t, "a callback without its outcomes: %+v", w)
			return nil
		}
		var problems []string
		for i, o := range w.Outcomes {
			switch {
			case o.Index != i || o.ID != fmt.Sprintf("%s~%d", w.ID, i):
				problems = append(problems, fmt.Sprintf("outcome %d names %s (index %d)", i, o.ID, o.Index))
			case o.State == engine.StateDone && string(o.Result) != fmt.Sprintf("%s:%d", w.ID, i):
				problems = append(problems, fmt.Sprintf("member %d result %q", i, o.Result))
			case o.State == engine.StateDead && !flowFails(i):
				problems = append(problems, fmt.Sprintf("member %d dead: %s", i, o.Error))
			case o.State != engine.StateDone && o.State != engine.StateDead:
				problems = append(problems, fmt.Sprintf("member %d %s", i, o.State))
			}
		}
		if len(problems) > 0 {
			bad(t, "outcomes: %s", strings.Join(problems, "; "))
		}
		return nil
	}))
}
