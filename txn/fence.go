package txn

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gomodule/redigo/redis"
)

// ErrFenced is matched (errors.Is) by the error of a transaction that a
// [Fence] refused: the fence key holds a number above the Runner's, so
// nothing was written.
var ErrFenced = errors.New("txn: fence key is past this process's epoch")

// Fence makes every transaction of a [Runner] conditional on one key, an
// epoch: Run and each step of Pipeline WATCH Key and read it before
// anything is queued, and refuse to write (an error matching [ErrFenced])
// unless it does not exist or holds an integer no greater than Max; a
// Held watch covers Key too, so a change of Key between a transaction and
// its held successor aborts the latter. Because Key is watched, a change
// made after the read aborts EXEC as any watched key does: no write of a
// fenced Runner lands after Key was raised past Max.
//
// The read costs one round trip in Run (before the function's first read)
// and nothing in Pipeline (it travels with the step's reads).
type Fence struct {
	Key string
	Max int64
}

// FenceError is the refusal of a fenced transaction.
type FenceError struct {
	Key string
	Max int64  // the Runner's epoch
	Got string // what Key holds
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("txn: %s holds %q, past this process's %d: %v", e.Key, e.Got, e.Max, ErrFenced)
}

// Unwrap returns ErrFenced.
func (e *FenceError) Unwrap() error { return ErrFenced }

// judge checks the fence key's value as read.
func (f *Fence) judge(rep interface{}) error {
	if e, ok := rep.(redis.Error); ok {
		return fmt.Errorf("txn: GET %s: %w", f.Key, e)
	}
	if rep == nil {
		return nil
	}
	got, err := redis.String(rep, nil)
	if err != nil {
		return fmt.Errorf("txn: GET %s: %w", f.Key, err)
	}
	if n, err := strconv.ParseInt(got, 10, 64); err != nil || n > f.Max {
		return &FenceError{Key: f.Key, Max: f.Max, Got: got}
	}
	return nil
}

// wrapRun adds the fence to a transaction of Run.
func (f *Fence) wrapRun(watch []string, fn func(*Tx) error) ([]string, func(*Tx) error) {
	w := append(slices.Clip(watch), f.Key)
	return w, func(tx *Tx) error {
		rep, err := tx.Do("GET", f.Key)
		if err != nil {
			return err
		}
		if err := f.judge(rep); err != nil {
			return err
		}
		return fn(tx)
	}
}

// wrapSteps adds the fence to the steps of a Pipeline.
func (f *Fence) wrapSteps(steps []Step) []Step {
	out := make([]Step, len(steps))
	for i, st := range steps {
		build := st.Build
		out[i] = Step{
			Watch: append(slices.Clip(st.Watch), f.Key), // WatchArgs left out: boxed afresh
			Reads: append([]Cmd{{Name: "GET", Args: []interface{}{f.Key}}}, st.Reads...),
			Build: func(reads []interface{}, q *Cmds) error {
				if err := f.judge(reads[0]); err != nil {
					return err
				}
				return build(reads[1:], q)
			},
		}
	}
	return out
}
