package txn

import (
	"context"
	"errors"
	"fmt"

	"github.com/gomodule/redigo/redis"
)

// Step is one transaction of a [Runner.Pipeline] whose reads are known
// before it starts: it WATCHes Watch, sends Reads, and Build decides the
// writes from their replies.
type Step struct {
	// Watch are the keys to watch; none makes a plain MULTI/EXEC.
	Watch []string
	// WatchArgs, when not nil, are the keys of Watch as command
	// arguments, in the same order: a caller that has them boxed already
	// spares the pipeline boxing each key again.
	WatchArgs []interface{}
	// Reads are sent right after the WATCH, in the same round trip.
	Reads []Cmd
	// Build sees the replies to Reads in order (an error reply as a
	// redis.Error element) and queues the writes on q. It runs once: a
	// step is not retried. An error from Build ends the step without
	// writing, and is the step's result.
	Build func(reads []interface{}, q *Cmds) error
}

// StepResult is what one step of a pipeline came to.
type StepResult struct {
	// Replies is EXEC's reply, one element per queued command (also with
	// an *ExecError, since at Redis 2.4 the other commands ran).
	Replies []interface{}
	// Err is nil when the step committed or queued nothing, an error
	// wrapping ErrConflict when a watched key changed (nothing written),
	// an *ExecError, Build's error, or a command refused before MULTI.
	Err error
}

// Pipeline runs steps on conn one after another, keeping two in flight:
// each step's MULTI, writes and EXEC travel in the same round trip as the
// next step's WATCH and reads, so n steps cost n+1 round trips instead of
// 2n. Each round trip is bounded by ctx.
//
// Steps are not retried: a step that meets a conflict is reported with
// ErrConflict (and counted in [Runner.Conflicts]), because a caller that
// chose the steps from a snapshot should choose again from a fresh one.
// Every step is judged on its own and a failed step does not stop the
// others. Pipeline returns one result per step that ran; it stops early,
// with err, only when the connection fails or answers out of turn, or the
// server refused an EXEC (at maxmemory): the steps after the last result
// did not commit (the one in flight may have, if the connection failed
// after its EXEC was sent). On a server older than 2.6.5 each step reads
// the replies to its queued commands before EXEC (see [Runner.Run]), one
// more round trip per step that writes.
func (r *Runner) Pipeline(ctx context.Context, conn redis.Conn, steps []Step) ([]StepResult, error) {
	if len(steps) == 0 {
		return nil, nil
	}
	if r.Fence != nil {
		steps = r.Fence.wrapSteps(steps)
	}
	legacy, err := r.checkQueued(ctx, conn)
	if err != nil {
		return nil, err
	}
	results := make([]StepResult, 0, len(steps))
	if err := sendStep(conn, steps[0]); err != nil {
		return results, err
	}
	reps, err := values(Do(ctx, conn, ""))
	if err != nil {
		return results, fmt.Errorf("txn: pipeline: %w", err)
	}
	for i, st := range steps {
		w := 0
		if len(st.Watch) > 0 {
			w = 1
		}
		if len(reps) != w+len(st.Reads) {
			return results, fmt.Errorf("txn: pipeline step %d: %d replies to %d reads", i, len(reps), w+len(st.Reads))
		}
		if w == 1 {
			if e, ok := reps[0].(redis.Error); ok {
				return results, fmt.Errorf("txn: pipeline step %d: WATCH: %w", i, e)
			}
		}
		var q Cmds
		berr := st.Build(reps[w:], &q)
		if berr == nil {
			berr = check(q, nil)
		}
		// multi are the replies to MULTI and q when a server that runs
		// the rest after a refused command had them read before EXEC.
		var multi []interface{}
		n := 0 // replies of this step in the next round trip
		switch {
		case berr == nil && len(q) > 0 && legacy:
			_, multi, err = openMulti(ctx, conn, 0, q)
			var ee *ExecError
			if errors.As(err, &ee) {
				// Refused while queueing and discarded: nothing written.
				berr = err
				break
			}
			if err != nil {
				return results, err
			}
			if err := conn.Send("EXEC"); err != nil {
				return results, fmt.Errorf("txn: send EXEC: %w", err)
			}
			n = 1
		case berr == nil && len(q) > 0:
			if err := sendMulti(conn, q); err != nil {
				return results, err
			}
			n = len(q) + 2
		case w == 1:
			if err := conn.Send("UNWATCH"); err != nil {
				return results, fmt.Errorf("txn: send UNWATCH: %w", err)
			}
			n = 1
		}
		if i+1 < len(steps) {
			if err := sendStep(conn, steps[i+1]); err != nil {
				return results, err
			}
		}
		all, err := values(Do(ctx, conn, ""))
		if err != nil {
			return results, fmt.Errorf("txn: pipeline: %w", err)
		}
		if len(all) < n {
			return results, fmt.Errorf("txn: pipeline step %d: %d replies, want at least %d", i, len(all), n)
		}
		res := StepResult{Err: berr}
		if berr == nil && len(q) > 0 {
			execAll := all[:n]
			if multi != nil {
				execAll = append(multi, all[0])
			}
			res.Replies, res.Err = execReplies(q, execAll)
			if errors.Is(res.Err, errNilExec) {
				r.conflicts.Add(1)
			}
			if multi != nil && execFailed(all[0]) {
				// Redis 2.4 refused EXEC (at maxmemory) and kept the
				// transaction open, with the next step's commands queued
				// in it.
				results = append(results, res)
				return results, discardAfter(ctx, conn, fmt.Errorf("txn: pipeline step %d: %w", i, res.Err))
			}
		}
		results = append(results, res)
		reps = all[n:]
	}
	return results, nil
}

// sendStep sends a step's WATCH and reads without flushing.
func sendStep(conn redis.Conn, st Step) error {
	if len(st.Watch) > 0 {
		w := Cmd{Name: "WATCH", Args: st.WatchArgs}
		if len(st.WatchArgs) != len(st.Watch) {
			w = watchCmd(st.Watch)
		}
		if err := sendAll(conn, []Cmd{w}); err != nil {
			return err
		}
	}
	return sendAll(conn, st.Reads)
}
