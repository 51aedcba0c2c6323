package chaos

import "testing"

// TestInterruptionsAdd: one interruption per process and task, whatever
// the evidence, except lease-lost log lines, each a run of its own.
func TestInterruptionsAdd(t *testing.T) {
	m := interruptions{}
	m.add("a", interruption{pid: 1, reason: "in its handler when the worker was killed"})
	m.add("a", interruption{pid: 1, reason: "claimed by the worker when it was killed"})
	m.add("a", interruption{pid: 1, reason: "its lease ran out", leaseLog: true})
	if n := len(m["a"]); n != 1 {
		t.Errorf("a kill and what else the killed process held: %d interruptions, want 1", n)
	}
	m.add("b", interruption{pid: 2, reason: "its lease ran out", leaseLog: true})
	m.add("b", interruption{pid: 2, reason: "its lease ran out", leaseLog: true})
	m.add("b", interruption{pid: 2, reason: "claimed by the worker when it was killed"})
	m.add("b", interruption{pid: 3, reason: "its lease ran out", leaseLog: true})
	if n := len(m["b"]); n != 3 {
		t.Errorf("two lease-lost lines of one worker and one of another: %d interruptions, want 3", n)
	}
}
