// Package testwait waits in tests for a condition that has no event to
// wait for (a child process, a server's state), by polling it until a
// deadline. Tests that can wait for an event (a channel, a hook) do that
// instead.
package testwait

import (
	"testing"
	"time"
)

const (
	firstPoll = 10 * time.Millisecond // the first pause between two checks
	lastPoll  = 50 * time.Millisecond // the pause grows up to this
)

// Until calls cond until it returns true, failing t with "timed out after
// timeout waiting for what" if it has not by then. The pause between two
// calls starts at 10 ms and grows to 50 ms. Call it from the test's
// goroutine (it calls t.Fatalf).
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := firstPoll
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		// real time: the condition has no event to wait for, so it is
		// polled; the pause only spaces the checks out.
		time.Sleep(pause)
		if pause = pause * 3 / 2; pause > lastPoll {
			pause = lastPoll
		}
	}
}
