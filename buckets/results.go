package buckets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// Final is the outcome of a task's final transition (done, dead or
// cancelled), as pushed onto its completion list ([Keys.Completion]) and,
// with the result, as the payload of its reply task (Record.ReplyTo). Its
// stored form is JSON, so that programs in any language can read replies.
type Final struct {
	ID       string `json:"id"`
	State    string `json:"state"`            // "done", "dead" or "cancelled"
	Error    string `json:"error,omitempty"`  // the last error of a dead task
	Result   []byte `json:"result,omitempty"` // replies only: the result of a done task
	Finished int64  `json:"finished"`         // Unix ms
}

// EncodeFinal returns f's stored form.
func EncodeFinal(f *Final) []byte {
	b, _ := json.Marshal(f) // a struct of strings and numbers cannot fail
	return b
}

// DecodeFinal parses a completion or reply element.
func DecodeFinal(b []byte) (*Final, error) {
	var f Final
	if err := json.Unmarshal(b, &f); err != nil || f.ID == "" || f.State == "" {
		return nil, fmt.Errorf("buckets: outcome %q: %w", truncate(string(b), 200), ErrMalformed)
	}
	return &f, nil
}

// finalWrites queues what every final transition of record r (made done,
// dead or cancelled in the same MULTI) writes besides the record:
//
//	DEL      u:<key>                      a unique key taken without a ttl
//	SETEX    r:<id> ResultTTL result      done with a result
//	DEL/RPUSH/EXPIRE c:<id> outcome       the completion list, for Wait
//	                                      (see finalWritesFor for when not)
//	SET t:<rid>, SADD queues, LPUSH q:<q> rid + tokens
//	                                      when enqueued with a reply queue
//	the workflow's writes                 a workflow's task: see flowWrites
//
// Deleting a unique key without reading it is safe only for a key taken
// without a ttl: nobody else can take it while r holds it, and r holds
// it until this very MULTI. A key with a ttl is left to expire (after an
// expiry another task may hold it).
func (s *Store) finalWrites(tx queuer, r *Record) { s.finalWritesFor(tx, r, true) }

// finalWritesFor is finalWrites, with the completion list only when
// completion is set. A final transition may leave it out only when its
// record says the same for at least as long (see skipsCompletion): Wait
// reads the outcome from the record then.
func (s *Store) finalWritesFor(tx queuer, r *Record, completion bool) {
	if r.Unique != "" && r.UniqueTTL == 0 {
		tx.Queue("DEL", s.Keys.Unique(r.Unique))
	}
	if r.State == StateDone && len(r.Result) > 0 && s.ResultTTL > 0 {
		tx.Queue("SETEX", s.Keys.Result(r.ID), s.ResultTTL, r.Result)
	}
	s.flowWrites(tx, r)
	if !completion && r.ReplyTo == "" {
		return // the common success: nobody waits, nothing to tell
	}
	f := &Final{ID: r.ID, State: r.State.String(), Finished: r.Finished}
	if r.State == StateDead {
		f.Error = r.LastError
	}
	if completion {
		c := s.Keys.Completion(r.ID)
		tx.Queue("DEL", c)
		tx.Queue("RPUSH", c, EncodeFinal(f))
		tx.Queue("EXPIRE", c, s.completionTTL())
	}
	if r.ReplyTo == "" {
		return
	}
	if r.State == StateDone {
		f.Result = r.Result
	}
	q, _ := strings.CutPrefix(r.ReplyTo, ReplyQueuePrefix)
	// A reply task: its id names the task and the outcome (the run
	// number and the time), so every final outcome has its own.
	reply := &Record{
		ID:    fmt.Sprintf("%s~r%d.%d", r.ID, r.Runs, r.Finished),
		Queue: q, Type: ReplyType, Payload: EncodeFinal(f), State: StateWaiting,
		MaxAttempts: max(r.MaxAttempts, 1), TimeoutMs: max(r.TimeoutMs, 1),
		Created: r.Finished, Due: max(r.Finished, 1),
	}
	tx.Queue("SET", s.Keys.Task(reply.ID), reply.Encode())
	tx.Queue("SADD", s.Keys.Queues(), q)
	s.pushReady(tx, q, []string{reply.ID}, false)
	r.Spawned = append(r.Spawned, reply)
}

// ReplyQueuePrefix starts a Record.ReplyTo: the queue into which the final
// transition enqueues a reply task (type ReplyType, the outcome as its
// payload). A ReplyTo without it names the queue all the same.
const ReplyQueuePrefix = "q:"

// ReplyType is the task type of reply tasks.
const ReplyType = "bucketq.reply"

// MinCompletionTTL is the least time, in seconds, a completion list is
// kept, whatever the result retention: long enough for every blocked
// waiter to see it.
const MinCompletionTTL = 60

func (s *Store) completionTTL() int64 { return max(s.ResultTTL, MinCompletionTTL) }

// WaiterTTL is how long, in seconds, the mark a waiter leaves on a task
// ([Keys.Waiter], set by Completed) lasts. Every waiter sets the same
// lifetime, so one waiter never shortens another's mark; a waiter blocks
// at most MaxAwait seconds at a time and marks again before the next
// block, so its mark outlives every block.
const WaiterTTL = 30

// MaxAwait bounds, in seconds, one blocking wait of AwaitCompletion.
const MaxAwait = 20

// skipsCompletion reports whether a success recorded with doneTTL may
// leave the completion list out when nobody waits (no mark on the task):
// the done record, kept doneTTL seconds, tells a later waiter the same
// outcome at least as long as the list would have (completionTTL).
func (s *Store) skipsCompletion(doneTTL int64) bool { return doneTTL >= s.completionTTL() }

// Result returns task id's stored result, or nil when there is none (the
// task has not succeeded, recorded none, or its retention passed).
func (s *Store) Result(ctx context.Context, conn redis.Conn, id string) ([]byte, error) {
	b, err := redis.Bytes(do(ctx, conn, "GET", s.Keys.Result(id)))
	if errors.Is(err, redis.ErrNil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("buckets: result of %s: %w", id, err)
	}
	return b, nil
}

// Completed marks task id as waited for and reads its completion and
// record, in one transaction (MULTI; SETEX cw:<id> WaiterTTL 1; LINDEX
// c:<id> 0; GET t:<id>; GET r:<id>; EXEC), so that a record deleted right
// after its final transition is not mistaken for one never written.
//
// The mark makes every final transition that commits after it push the
// completion list (one that leaves the list out reads the mark under
// WATCH); one that committed before it shows in the snapshot, in the list
// or in the record. A waiter calls Completed again before each block of
// AwaitCompletion, so it never blocks without a live mark.
//
// final is the outcome: read from the record when the record is final
// (done, dead or cancelled), else from the completion list; nil while the
// task has not ended (or both expired). rec is nil when there is no record
// (or it cannot be decoded; err says so only for errors of Redis).
func (s *Store) Completed(ctx context.Context, conn redis.Conn, id string) (final *Final, rec *Record, result []byte, err error) {
	var cmds cmdList
	cmds.Queue("SETEX", s.Keys.Waiter(id), WaiterTTL, 1)
	cmds.Queue("LINDEX", s.Keys.Completion(id), 0)
	cmds.Queue("GET", s.Keys.Task(id))
	cmds.Queue("GET", s.Keys.Result(id))
	reps, err := s.exec(ctx, conn, cmds)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("buckets: completion of %s: %w", id, err)
	}
	if b, ok := reps[2].([]byte); ok {
		if r, derr := DecodeRecord(id, b); derr == nil {
			rec = r
		}
	}
	if rec != nil {
		switch rec.State {
		case StateDone, StateDead, StateCancelled:
			final = &Final{ID: id, State: rec.State.String(), Finished: rec.Finished}
			if rec.State == StateDead {
				final.Error = rec.LastError
			}
		}
	}
	if b, ok := reps[1].([]byte); ok && final == nil {
		if f, derr := DecodeFinal(b); derr == nil {
			final = f
		}
	}
	result, _ = reps[3].([]byte)
	return final, rec, result, nil
}

// AwaitCompletion blocks up to secs whole seconds (at least 1, at most
// MaxAwait) for task
// id's completion: BRPOPLPUSH c:<id> c:<id> secs, which hands the one
// element back to the same list, so any number of waiters see it and a
// reply lost on a dropped connection loses nothing. It returns nil, nil
// when the time passed first. ctx bounds the call and should allow secs
// plus a margin.
func (s *Store) AwaitCompletion(ctx context.Context, conn redis.Conn, id string, secs int) (*Final, error) {
	c := s.Keys.Completion(id)
	b, err := redis.Bytes(do(ctx, conn, "BRPOPLPUSH", c, c, min(max(secs, 1), MaxAwait)))
	if errors.Is(err, redis.ErrNil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("buckets: wait for %s: %w", id, err)
	}
	return DecodeFinal(b)
}
