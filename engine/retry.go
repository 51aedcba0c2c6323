package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// retryPolicy turns a handler's result into the record's next state:
// done, run again later (a failure within MaxAttempts, or a snooze), or
// the dead letters.
type retryPolicy struct {
	cfg Config
}

func (p *retryPolicy) decide(r *buckets.Record, now time.Time, herr error) buckets.Outcome {
	if herr == nil {
		return buckets.Done // before ra, which errors.As moves to the heap
	}
	var ra *snoozeError
	if errors.As(herr, &ra) {
		if r.Snoozes >= max(p.cfg.Advanced.MaxSnoozes, 0) {
			r.LastError = fmt.Sprintf("snoozed too often (%d times, Advanced.MaxSnoozes)", r.Snoozes)
			return buckets.Bury
		}
		r.Snoozes++
		r.State = buckets.StateWaiting
		r.Due = msCeil(now.Add(ra.d))
		return buckets.Again
	}
	t := taskFromRecord(r) // as the handler saw it
	r.Attempts++
	r.LastError = truncateErr(herr)
	if errors.Is(herr, ErrNoHandler) && p.cfg.UnknownType == "dead" {
		return buckets.Bury
	}
	if isPermanent(herr) || r.Attempts >= r.MaxAttempts {
		return buckets.Bury
	}
	r.State = buckets.StateRetry
	r.Due = msCeil(now.Add(max(p.cfg.RetryDelay(t, r.Attempts, herr), 0)))
	return buckets.Again
}

func truncateErr(err error) string {
	s := err.Error()
	var p *panicError
	if errors.As(err, &p) {
		s += "\n" + p.Stack
	}
	if len(s) > buckets.MaxErrorLen {
		s = s[:buckets.MaxErrorLen]
	}
	return s
}
