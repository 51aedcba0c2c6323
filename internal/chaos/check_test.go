package chaos

import (
	"syscall"
	"testing"

	"github.com/bucketq/bucketq/internal/chaos/ledger"
)

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

// TestReapedAfterKillExplainsRerun: a run that ended in a worker killed
// before its result was recorded, and ran again after a reaper returned
// the dead worker's tasks, is explained (weakly) even when the kill's
// snapshot of the worker's holdings missed it.
func TestReapedAfterKillExplainsRerun(t *testing.T) {
	obs := &observed{runs: map[string][]*ledger.Run{
		"a": {{ID: "a", PID: 7, Start: 10, End: 12}, {ID: "a", PID: 8, Start: 20, End: 22, Recoveries: 1}},
		"b": {{ID: "b", PID: 9, Start: 10, End: 12}, {ID: "b", PID: 8, Start: 20, End: 22, Recoveries: 1}},
	}}
	kill := &killEvent{PID: 7, Signal: syscall.SIGKILL, WorkerIDs: []string{"w0", "w1"}}
	other := &killEvent{PID: 9, Signal: syscall.SIGKILL, WorkerIDs: []string{"v0", "v1"}}
	c := &checker{h: &harness{}, rep: &Report{}, obs: obs, inter: interruptions{},
		killed: map[int]*killEvent{7: kill, 9: other}, reaped: map[string]bool{"w1": true}}
	c.weakEvidence()
	c.duplicates()
	if c.rep.DupWeak != 1 || c.rep.DupUnexplained != 1 || len(c.unexplained) != 1 || c.unexplained[0] != "b" {
		t.Errorf("weakly explained %d, unexplained %d %v; want a weakly explained (its worker reaped) and b unexplained (its worker not reaped)",
			c.rep.DupWeak, c.rep.DupUnexplained, c.unexplained)
	}
}
