package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// ErrNoResultHere: SetResult with a context that is not a handler's.
var errNoResultHere = errors.New("engine: SetResult outside a handler")

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
// matching ErrTooLarge (nothing is cut silently).
func SetResult(ctx context.Context, b []byte) error {
	box, _ := ctx.Value(resultKey{}).(*resultBox)
	if box == nil {
		return errNoResultHere
	}
	if len(b) > box.max {
		return fmt.Errorf("engine: result of %d bytes, limit %d (Config.MaxResult): %w", len(b), box.max, ErrTooLarge)
	}
	box.result = append([]byte{}, b...)
	return nil
}

// Outcome is a finished task's final state, as Client.Wait, a reply task
// (DecodeReply) and a group's callback (Task.Workflow.Outcomes) see it.
type Outcome struct {
	ID       string    `json:"id"`
	State    State     `json:"state"`            // StateDone, StateDead or StateCancelled
	Error    string    `json:"error,omitempty"`  // the last error of a dead task
	Result   []byte    `json:"result,omitempty"` // a done task's result, while kept (Config.ResultRetention)
	Finished time.Time `json:"-"`
	// Index is a group member's index (in Task.Workflow.Outcomes).
	Index int `json:"index"`
	// ResultRef: a group member's result was too large to carry;
	// Client.Result(ID) reads it while it is kept.
	ResultRef bool `json:"result_ref,omitempty"`
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

// DecodeReply parses the payload of a reply task (ReplyTo): the outcome of
// the task it answers (JSON: "id", "state", "error", "result" in base64,
// "finished" in Unix ms).
func DecodeReply(b []byte) (*Outcome, error) {
	f, err := buckets.DecodeFinal(b)
	if err != nil {
		return nil, &engineError{msg: "engine: " + stripLayers(err.Error()), cause: err}
	}
	return outcomeOf(f, nil), nil
}

// Result is Client.Result for one lane.
func (c *laneClient) Result(ctx context.Context, id string) ([]byte, error) {
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

// Wait is Client.Wait for one lane.
func (c *laneClient) Wait(ctx context.Context, id string) (*Outcome, error) {
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
