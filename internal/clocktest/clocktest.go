// Package clocktest has clocks for tests of the engine's time handling:
// processes whose clocks disagree, or a test that needs to be hours away.
// Their timers run on real time; a test that drives timers uses
// clockwork.NewFakeClock instead.
package clocktest

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// offset is the real clock shifted by a fixed offset.
type offset struct {
	clockwork.Clock
	d time.Duration
}

// Offset is a clock d away from the real one, for tests of clock skew
// between processes. Its timers run on real time.
func Offset(d time.Duration) clockwork.Clock {
	return offset{Clock: clockwork.NewRealClock(), d: d}
}

func (o offset) Now() time.Time                  { return time.Now().Add(o.d) }
func (o offset) Since(t time.Time) time.Duration { return o.Now().Sub(t) }
func (o offset) Until(t time.Time) time.Duration { return t.Sub(o.Now()) }

// Settable is a clock a test sets by hand; its timers run on real time.
type Settable struct {
	clockwork.Clock
	mu  sync.Mutex
	now time.Time
}

// NewSettable returns a Settable clock at t.
func NewSettable(t time.Time) *Settable {
	return &Settable{Clock: clockwork.NewRealClock(), now: t}
}

// Now returns the time last set.
func (c *Settable) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set sets the time.
func (c *Settable) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *Settable) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *Settable) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
