package testwait

import (
	"sync"
	"testing"
	"time"
)

func TestUntilReturnsOnceTrue(t *testing.T) {
	t.Parallel()
	n := 0
	Until(t, time.Minute, "the third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// fatalTB records Fatalf instead of stopping the goroutine's test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = format
	panic(f)
}

func TestUntilFailsAfterTimeout(t *testing.T) {
	t.Parallel()
	f := &fatalTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != f {
				t.Fatalf("recovered %v, want the Fatalf", r)
			}
		}()
		Until(f, 30*time.Millisecond, "never", func() bool { return false })
	}()
	if f.msg != "timed out after %v waiting for %s" {
		t.Fatalf("Fatalf format %q", f.msg)
	}
}

// Pulse.Until checks its condition again at each Beat, not by polling,
// and misses none: a change beaten before it waits is seen by its check.
func TestPulseUntil(t *testing.T) {
	t.Parallel()
	var p Pulse
	var mu sync.Mutex
	n := 0
	go func() {
		for range 3 {
			mu.Lock()
			n++
			mu.Unlock()
			p.Beat()
		}
	}()
	p.Until(t, time.Minute, "three changes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return n == 3
	})
}
