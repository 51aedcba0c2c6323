// Package testwait is how tests wait: the one polling loop they use when
// there is no event to wait for (a child process, a server coming up),
// and a pulse for a series of events.
package testwait

import (
	"sync"
	"testing"
	"time"
)

// Until calls cond until it returns true, failing t with t.Fatalf if it
// has not after timeout. what names the condition in the failure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	until(t, timeout, what, cond, nil)
}

// UntilShowing is Until that, on a timeout, first logs state(): what the
// last check saw.
func UntilShowing(t testing.TB, timeout time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	until(t, timeout, what, cond, state)
}

func until(t testing.TB, timeout time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			if state != nil {
				t.Logf("waiting for %s: %s", what, state())
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		// real time: the condition has no event to wait for, so it is
		// polled; the interval grows so a long wait costs little CPU.
		time.Sleep(interval)
		if interval < 50*time.Millisecond {
			interval += 10 * time.Millisecond
		}
	}
}

// Pulse lets goroutines wait for the next of a series of events: Wait
// returns a channel that the next Beat closes. The zero Pulse is ready.
type Pulse struct {
	mu sync.Mutex
	ch chan struct{}
}

// Wait returns a channel closed at the next Beat.
func (p *Pulse) Wait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil {
		p.ch = make(chan struct{})
	}
	return p.ch
}

// Beat closes the channel of every Wait since the last Beat.
func (p *Pulse) Beat() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
}

// Until waits, up to timeout, for cond to hold, checking it again at
// each Beat: a condition whose every change beats p, waited for without
// polling.
func (p *Pulse) Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		next := p.Wait()
		if cond() {
			return
		}
		select {
		case <-next:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}
