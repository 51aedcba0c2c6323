package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// ErrResultTooLarge: SetResult with more than Config.MaxResult bytes.
// Nothing is recorded; the handler decides what to do (returning the
// error fails the run).
var ErrResultTooLarge = errors.New("engine: result too large")

// ErrNoResultHere: SetResult with a context that is not a handler's.
var ErrNoResultHere = errors.New("engine: SetResult outside a handler")

type resultKey struct{}

// resultBox holds what a handler recorded with SetResult.
type resultBox struct {
	max    int
	result []byte
}

// SetResult records b as the result of the task whose handler was given
// ctx: if the handler then succeeds, b is stored with the task in the same
// transaction that records the success, kept for Config.ResultRetention,
// returned by Client.Result and Client.Wait and sent with the reply of
// ReplyTo. A later call replaces an earlier one; a failed run's result is
// dropped. More than Config.MaxResult bytes is refused with an error
// matching ErrResultTooLarge (nothing is cut silently).
func SetResult(ctx context.Context, b []byte) error {
	box, _ := ctx.Value(resultKey{}).(*resultBox)
	if box == nil {
		return ErrNoResultHere
	}
	if len(b) > box.max {
		return fmt.Errorf("engine: result of %d bytes, limit %d (Config.MaxResult): %w", len(b), box.max, ErrResultTooLarge)
	}
	box.result = append([]byte{}, b...)
	return nil
}

// Outcome is a finished task's final state, as Client.Wait reports it.
type Outcome struct {
	ID       string
	State    State  // StateDone, StateDead or StateCancelled
	Error    string // the last error of a dead task
	Result   []byte // a done task's result, while kept (Config.ResultRetention)
	Finished time.Time
}

// Err is nil for a done task, and an error naming the state and the
// last error otherwise.
func (o *Outcome) Err() error {
	switch o.State {
	case StateDone:
		return nil
	case StateDead:
		return fmt.Errorf("engine: task %s died: %s", o.ID, o.Error)
	}
	return fmt.Errorf("engine: task %s was %s", o.ID, o.State)
}

func outcomeOf(f *buckets.Final, result []byte) *Outcome {
	o := &Outcome{ID: f.ID, State: State(f.State), Error: f.Error, Result: f.Result, Finished: fromMs(f.Finished)}
	if o.Result == nil && o.State == StateDone {
		o.Result = result
	}
	return o
}

// Reply is a reply record, as pushed onto a reply list named with
// ReplyTo: the task's id, final state, and its result or last error.
type Reply = Outcome

// DecodeReply parses an element of a reply list (JSON: "id", "state",
// "error", "result" in base64, "finished" in Unix ms).
func DecodeReply(b []byte) (*Reply, error) {
	f, err := buckets.DecodeFinal(b)
	if err != nil {
		return nil, &engineError{msg: "engine: " + stripLayers(err.Error()), cause: err}
	}
	return outcomeOf(f, nil), nil
}

// Result returns the result a done task recorded with SetResult, or nil
// when it recorded none, has not succeeded, or its retention passed.
func (c *Client) Result(ctx context.Context, id string) ([]byte, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	b, err := c.store.Result(ctx, conn, id)
	if err != nil {
		return nil, failed("result of task "+id, err)
	}
	return b, nil
}

// waitSlice is the longest one blocking wait of Wait, in whole seconds.
const waitSlice = 5

// Wait blocks until task id is done, dead or cancelled, and returns its
// outcome (with the result of a done task). It does not poll: it marks
// the task as waited for and blocks on its completion list (BRPOPLPUSH,
// whole seconds at a time, re-armed until ctx ends), on a connection of
// its own; every final transition after the mark pushes that list. A task
// that ended before Wait (or between two blocks) is found at once, from
// its completion list or its record: a success whose record is kept at
// least as long as a completion list would be pushes none when nobody
// waits, and its record says the outcome. ErrNotFound: no such task (or
// its record and completion both expired). When ctx ends first, ctx's
// error.
func (c *Client) Wait(ctx context.Context, id string) (*Outcome, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	for first := true; ; first = false {
		// Mark and look, before every block: the mark lives longer than
		// one block, and an outcome that came while it was not set is
		// in the record.
		final, rec, result, err := c.store.Completed(ctx, conn, id)
		if err != nil {
			if ctx.Err() != nil && !first {
				return nil, ctx.Err()
			}
			return nil, failed("wait for task "+id, err)
		}
		if final != nil {
			return outcomeOf(final, result), nil
		}
		if rec == nil && first {
			return nil, refused(ErrNotFound, buckets.ErrNotFound, "cannot wait for task %s: there is no such task (never enqueued, or its record expired)", id)
		}
		secs := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			secs = min(waitSlice, max(1, int(time.Until(dl)/time.Second)))
		}
		bctx, cancel := context.WithTimeout(ctx, time.Duration(secs+2)*time.Second)
		f, err := c.store.AwaitCompletion(bctx, conn, id, secs)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, failed("wait for task "+id, err)
		}
		if f != nil {
			var res []byte
			if f.State == "done" {
				if res, err = c.store.Result(ctx, conn, id); err != nil {
					return nil, failed("result of task "+id, err)
				}
			}
			return outcomeOf(f, res), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// NextReply takes the oldest reply from reply list name (see ReplyTo),
// blocking until there is one or ctx ends (whole seconds at a time, on a
// connection of its own). A reply taken is removed from the list: with
// several readers, each reply goes to one of them. An element that is not
// a reply gives an error matching nothing but is removed all the same.
func (c *Client) NextReply(ctx context.Context, name string) (*Reply, error) {
	if !buckets.ValidName(name) {
		return nil, fmt.Errorf("engine: reply list %q: want 1-64 of A-Z a-z 0-9 _ . -: %w", name, ErrInvalidName)
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	for {
		secs := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			secs = min(waitSlice, max(1, int(time.Until(dl)/time.Second)))
		}
		bctx, cancel := context.WithTimeout(ctx, time.Duration(secs+2)*time.Second)
		b, err := c.store.PopReply(bctx, conn, name, secs)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, failed("reply list "+name, err)
		}
		if b != nil {
			return DecodeReply(b)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}
