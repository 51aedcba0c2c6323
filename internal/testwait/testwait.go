// Package testwait is the one polling loop tests use when there is no
// event to wait for (a child process, a server coming up).
package testwait

import (
	"testing"
	"time"
)

// Until calls cond until it returns true, failing t with t.Fatalf if it
// has not after timeout. what names the condition in the failure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
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
