package buckets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// EnqueueFlow writes workflow id: its hash (fields, name/value pairs) and
// its first tasks (recs, each with its Flow set: a chain's first step, or
// every member of a group), all or none.
//
//	WATCH   wf:<id>, t:<id> of every task it writes now or later (a
//	        chain's later steps, a group's callback)
//	read    EXISTS wf:<id>, EXISTS t:<id> ... (pipelined); any found:
//	        *ExistsError naming the workflow id or the task ids
//	queue   HMSET wf:<id> fields; MSET t:<id> <record> ...; SADD queues;
//	        per queue LPUSH q:<q> ids + tokens (due tasks); per bucket
//	        RPUSH b:<q>:<ts> + ZADD sched, HINCRBY scheduled, LPUSH/LTRIM
//	        wake (scheduled ones)
//
// A crash before EXEC leaves nothing, after it everything. A connection
// that fails after EXEC was sent gives an error wrapping ErrUncertain:
// retrying with the same id then writes the workflow or finds it, once.
func (s *Store) EnqueueFlow(ctx context.Context, conn redis.Conn, now int64, id string, fields []interface{}, recs []*Record) error {
	key := s.Keys.Workflow(id)
	watch := []string{key}
	ids := make([]string, 0, len(recs)+1)
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	// The ids it writes later must be free too: a chain's later steps,
	// a group's callback.
	if len(recs) > 0 && recs[0].Flow != nil {
		switch f := recs[0].Flow; f.Kind {
		case FlowChain:
			for i := len(recs); i < f.Total; i++ {
				ids = append(ids, FlowStepID(id, i))
			}
		case FlowMember:
			ids = append(ids, FlowCallbackID(id))
		}
	}
	for _, tid := range ids {
		watch = append(watch, s.Keys.Task(tid))
	}
	var cmds cmdList
	cmds.Queue("HMSET", append([]interface{}{key}, fields...)...)
	mset := []interface{}{}
	queues := map[string]bool{}
	ready := map[string][]string{}
	var readyQs []string
	for _, r := range recs {
		mset = append(mset, s.Keys.Task(r.ID), r.Encode())
		queues[r.Queue] = true
		if pl := r.Place(); r.Due <= now {
			if len(ready[pl]) == 0 {
				readyQs = append(readyQs, pl)
			}
			ready[pl] = append(ready[pl], r.ID)
		}
	}
	cmds.Queue("MSET", mset...)
	sadd := []interface{}{s.Keys.Queues()}
	for _, q := range sortedKeys(queues) {
		sadd = append(sadd, q)
	}
	cmds.Queue("SADD", sadd...)
	for _, q := range readyQs {
		s.pushReady(&cmds, q, ready[q], false)
	}
	for _, r := range recs {
		if r.Due > now {
			s.place(&cmds, r, now, false)
		}
	}
	sent := false
	_, err := s.run(ctx, conn, watch, func(tx *txn.Tx) error {
		sent = false
		for _, k := range watch {
			if err := tx.Send("EXISTS", k); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		var taken []string
		for i, rep := range reps {
			n, err := redis.Int(rep, asError(rep))
			if err != nil {
				return fmt.Errorf("EXISTS %s: %w", watch[i], err)
			}
			if n == 1 && i == 0 {
				return &ExistsError{IDs: []string{id}}
			}
			if n == 1 {
				taken = append(taken, ids[i-1])
			}
		}
		if len(taken) > 0 {
			return &ExistsError{IDs: taken}
		}
		for _, c := range cmds {
			tx.Queue(c.Name, c.Args...)
		}
		sent = true
		return nil
	})
	var ex *ExistsError
	var reply redis.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ex):
		return err
	case sent && !errors.Is(err, txn.ErrConflict) && !errors.As(err, &reply):
		return fmt.Errorf("buckets: workflow %s: %w: %w", id, ErrUncertain, err)
	}
	return fmt.Errorf("buckets: workflow %s: %w", id, err)
}

// FlowInfo is a workflow as FlowShow reads it.
type FlowInfo struct {
	ID        string
	Kind      string // "chain" or "group"
	Total     int
	Created   int64
	Ended     int64  // chain: when its last step succeeded or it was cancelled
	Policy    string // group
	Final, OK int    // group: members final, members done
	Fired     string // group: the callback's id once enqueued ("-" when it had none)
	Cancelled bool
	// Tasks are the records of the steps (chain) or members (group), by
	// index; nil where there is none (a step not reached yet, or a record
	// whose retention passed).
	Tasks []*Record
	// Outcomes are the members' kept outcomes (group), by index.
	Outcomes map[int]*FlowOutcome
	Callback *Record // group: the callback's record, once enqueued
}

// FlowShow reads workflow id: HGETALL wf:<id>, then MGET of its tasks'
// records (one round trip each). ErrNotFound when its hash is gone.
func (s *Store) FlowShow(ctx context.Context, conn redis.Conn, id string) (*FlowInfo, error) {
	all, err := redis.StringMap(do(ctx, conn, "HGETALL", s.Keys.Workflow(id)))
	if err != nil {
		return nil, fmt.Errorf("buckets: workflow %s: %w", id, err)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("buckets: workflow %s: %w", id, ErrNotFound)
	}
	fi := &FlowInfo{ID: id, Kind: all[FlowFieldKind], Policy: all[FlowFieldPolicy], Fired: all[FlowFieldFired],
		Cancelled: all[FlowFieldCancelled] != "", Outcomes: map[int]*FlowOutcome{}}
	fi.Total, _ = strconv.Atoi(all[FlowFieldTotal])
	fi.Created, _ = strconv.ParseInt(all[FlowFieldCreated], 10, 64)
	fi.Ended, _ = strconv.ParseInt(all[FlowFieldEnded], 10, 64)
	fi.Final, _ = strconv.Atoi(all[FlowFieldFinal])
	fi.OK, _ = strconv.Atoi(all[FlowFieldOK])
	if fi.Total < 1 || fi.Total > MaxGroupMembers {
		return nil, fmt.Errorf("buckets: workflow %s: %d tasks: %w", id, fi.Total, ErrMalformed)
	}
	for f, v := range all {
		idx, ok := strings.CutPrefix(f, flowOutcomePrefix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(idx)
		var o FlowOutcome
		if err == nil && json.Unmarshal([]byte(v), &o) == nil {
			fi.Outcomes[n] = &o
		}
	}
	args := make([]interface{}, 0, fi.Total+1)
	for i := range fi.Total {
		args = append(args, s.Keys.Task(FlowStepID(id, i)))
	}
	if fi.Kind == "group" {
		args = append(args, s.Keys.Task(FlowCallbackID(id)))
	}
	reps, err := redis.Values(do(ctx, conn, "MGET", args...))
	if err != nil {
		return nil, fmt.Errorf("buckets: workflow %s: %w", id, err)
	}
	fi.Tasks = make([]*Record, fi.Total)
	for i, rep := range reps {
		b, _ := rep.([]byte)
		if b == nil {
			continue
		}
		tid := FlowStepID(id, i)
		if i == fi.Total {
			tid = FlowCallbackID(id)
		}
		r, derr := DecodeRecord(tid, b)
		if derr != nil {
			continue
		}
		if i == fi.Total {
			fi.Callback = r
		} else {
			fi.Tasks[i] = r
		}
	}
	return fi, nil
}

// ErrFlowEnded: CancelFlow of a workflow that ended (chain done, group's
// callback enqueued).
var ErrFlowEnded = errors.New("workflow already ended")

// CancelFlow cancels workflow id and returns how many of its tasks it
// cancelled.
//
// First, one transaction marks the workflow:
//
//	WATCH   wf:<id>
//	read    HMGET wf:<id> kind n ended fired final
//	queue   HSET wf:<id> cancelled 1 (and EXPIRE it, a group whose members
//	        are all final)
//
// From then on a group's callback is never enqueued. Then each task that
// can still run is dealt with in a transaction of its own: a waiting or
// retrying one is cancelled (Cancel: its final transition records the
// outcome in the group, or ends the chain); a chain's step that is running
// or dead is marked (SET t:<id> with Flow.Cancelled, WATCHing it) so that
// its success writes no successor. A crash between them leaves the
// workflow marked and some tasks that may still run without going on:
// calling CancelFlow again finishes the job.
func (s *Store) CancelFlow(ctx context.Context, conn redis.Conn, id string, now, ttl int64) (int, error) {
	key := s.Keys.Workflow(id)
	var kind string
	var total int
	_, err := s.runner.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
		reps, err := valuesOf(tx.Do("HMGET", key, FlowFieldKind, FlowFieldTotal, FlowFieldEnded, FlowFieldFired, FlowFieldFinal))
		if err != nil {
			return err
		}
		str := func(i int) string { b, _ := reps[i].([]byte); return string(b) }
		kind = str(0)
		total, _ = strconv.Atoi(str(1))
		if kind == "" || total < 1 {
			return ErrNotFound
		}
		if str(2) != "" || str(3) != "" {
			return ErrFlowEnded
		}
		tx.Queue("HSET", key, FlowFieldCancelled, 1)
		if final, _ := strconv.Atoi(str(4)); kind == "group" && final >= total {
			s.expireFlow(tx, key)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("buckets: cancel workflow %s: %w", id, err)
	}
	n := 0
	if kind == "group" {
		for i := range total {
			err := s.Cancel(ctx, conn, FlowStepID(id, i), now, ttl)
			switch {
			case err == nil:
				n++
			case errors.Is(err, ErrAlreadyRunning), errors.Is(err, ErrAlreadyDone), errors.Is(err, ErrNotFound):
			default:
				return n, fmt.Errorf("buckets: cancel workflow %s: %w", id, err)
			}
		}
		return n, nil
	}
	// A chain: its one step that can still run is the last one written.
	for range total + 3 {
		cur, err := s.chainCurrent(ctx, conn, id, total)
		if err != nil {
			return n, err
		}
		if cur < 0 {
			return n, nil
		}
		done, cancelled, err := s.stopStep(ctx, conn, FlowStepID(id, cur), now, ttl)
		if err != nil {
			return n, fmt.Errorf("buckets: cancel workflow %s: %w", id, err)
		}
		if cancelled {
			n++
		}
		if done {
			return n, nil
		}
	}
	return n, fmt.Errorf("buckets: cancel workflow %s: its steps kept moving: %w", id, txn.ErrConflict)
}

// chainCurrent returns the index of chain id's last written step, -1
// when none is left.
func (s *Store) chainCurrent(ctx context.Context, conn redis.Conn, id string, total int) (int, error) {
	args := make([]interface{}, total)
	for i := range total {
		args[i] = s.Keys.Task(FlowStepID(id, i))
	}
	reps, err := redis.Values(do(ctx, conn, "MGET", args...))
	if err != nil {
		return 0, fmt.Errorf("buckets: workflow %s: %w", id, err)
	}
	for i := len(reps) - 1; i >= 0; i-- {
		if reps[i] != nil {
			return i, nil
		}
	}
	return -1, nil
}

// stopStep stops chain step id: cancels it when it waits (Cancel), marks
// it when it runs or is dead. done: nothing more to do for the chain;
// false when the step moved on meanwhile (it succeeded: look again).
func (s *Store) stopStep(ctx context.Context, conn redis.Conn, id string, now, ttl int64) (done, cancelled bool, err error) {
	key := s.Keys.Task(id)
	again := false
	_, err = s.runner.Run(ctx, conn, []string{key}, func(tx *txn.Tx) error {
		again, done, cancelled = false, false, false
		r, err := s.getRecord(tx, id)
		if err != nil {
			return err
		}
		switch {
		case r.Flow == nil || r.Flow.Kind != FlowChain:
			return fmt.Errorf("task %s is not a chain step: %w", id, ErrMalformed)
		case r.State == StateWaiting || r.State == StateRetry:
			again = true
		case (r.State == StateRunning || r.State == StateDead) && !r.Flow.Cancelled:
			f := *r.Flow
			f.Cancelled = true
			r.Flow = &f
			tx.Queue("SET", key, r.Encode())
			done = true
		case r.State == StateDone && len(r.Flow.Next) > 0 && !r.Flow.Cancelled:
			// It succeeded: its successor is the step to stop.
		default:
			done = true // ended, cancelled or already marked
		}
		return nil
	})
	if err != nil {
		return false, false, err
	}
	if !again {
		return done, false, nil
	}
	err = s.Cancel(ctx, conn, id, now, ttl)
	switch {
	case err == nil:
		return true, true, nil
	case errors.Is(err, ErrAlreadyRunning), errors.Is(err, ErrAlreadyDone):
		return false, false, nil // it moved: look again
	}
	return false, false, err
}

// flowFields returns a workflow hash's fields for EnqueueFlow.
func flowFields(kind string, total int, now int64, extra ...interface{}) []interface{} {
	return append([]interface{}{FlowFieldKind, kind, FlowFieldTotal, total, FlowFieldCreated, now}, extra...)
}

// ChainFields are the hash fields of a new chain of total steps.
func ChainFields(total int, now int64) []interface{} { return flowFields("chain", total, now) }

// GroupFields are the hash fields of a new group of total members, with
// policy and callback (an encoded Record whose Due is its delay after the
// group completes; nil for none).
func GroupFields(total int, now int64, policy string, callback []byte) []interface{} {
	extra := []interface{}{FlowFieldPolicy, policy, FlowFieldFinal, 0, FlowFieldOK, 0}
	if callback != nil {
		extra = append(extra, FlowFieldCallback, callback)
	}
	return flowFields("group", total, now, extra...)
}
