package testwait

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	Until(t, time.Minute, "the third call", func() bool { return calls.Add(1) == 3 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// fatalRecorder records Fatalf and stops the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func TestUntilFailsAtTheDeadline(t *testing.T) {
	t.Parallel()
	rec := &fatalRecorder{TB: t}
	func() {
		defer func() {
			if r := recover(); r != rec {
				t.Fatalf("Until did not fail: recovered %v", r)
			}
		}()
		Until(rec, 30*time.Millisecond, "nothing", func() bool { return false })
	}()
	if want := "timed out after 30ms waiting for nothing"; rec.msg != want {
		t.Fatalf("message %q, want %q", rec.msg, want)
	}
}
