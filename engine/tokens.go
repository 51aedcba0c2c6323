package engine

import (
	"context"
	"time"
)

// tokens is a counting semaphore: a fixed number of tokens, each taken
// and given back once. The processor bounds with them the tasks a worker
// holds (taken, not yet recorded), the handlers running at once, and the
// results handed over and not yet recorded. Giving back a token that was
// not taken is a bug in the caller, and panics rather than deadlock.
type tokens struct{ c chan struct{} }

func newTokens(n int) tokens { return tokens{c: make(chan struct{}, n)} }

// size is how many tokens there are.
func (t tokens) size() int { return cap(t.c) }

// out is how many are taken now.
func (t tokens) out() int { return len(t.c) }

// all reports whether every token is taken.
func (t tokens) all() bool { return len(t.c) == cap(t.c) }

// take takes one token, waiting for it until ctx ends (false: none taken).
func (t tokens) take(ctx context.Context) bool { return t.takeBefore(ctx, nil) }

// takeBefore is take that also gives up when expire fires.
func (t tokens) takeBefore(ctx context.Context, expire <-chan time.Time) bool {
	select {
	case t.c <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-expire:
		return false
	}
}

// tryTake takes one token if one is free now.
func (t tokens) tryTake() bool {
	select {
	case t.c <- struct{}{}:
		return true
	default:
		return false
	}
}

// takeFree takes, without waiting, free tokens until the caller holds
// want, n held already, and returns how many it holds then.
func (t tokens) takeFree(n, want int) int {
	for n < want && t.tryTake() {
		n++
	}
	return n
}

// takeWithin is takeFree that also waits up to d for tokens given back
// meanwhile, as long as more says others may still give some back.
func (t tokens) takeWithin(n, want int, d time.Duration, more func(n int) bool) int {
	n = t.takeFree(n, want)
	if n == want || d <= 0 || !more(n) {
		return n
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for n < want && more(n) {
		select {
		case t.c <- struct{}{}:
			n++
		case <-timer.C:
			return n
		}
	}
	// Tokens went back faster than they were taken: take those still free.
	return t.takeFree(n, want)
}

// give gives back n tokens.
func (t tokens) give(n int) {
	for range n {
		select {
		case <-t.c:
		default:
			panic("engine: a token given back that was not taken")
		}
	}
}
