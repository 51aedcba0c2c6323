package main

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EHandlerDiesWithEngine: when engine run is killed with SIGKILL
// (as by the OOM killer), the running handler command is killed too
// instead of living on beside the recovered copy of its task.
func TestE2EHandlerDiesWithEngine(t *testing.T) {
	h := newHarness(t)
	run := h.startRun(nil)
	h.enqueue("--type", "forever")
	var pid int
	h.eventually(10*time.Second, "the handler to start", func() bool {
		pid, _ = strconv.Atoi(strings.TrimSpace(h.file("leader")))
		return pid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("handler %d is not running", pid)
	}
	_ = run.cmd.Process.Signal(syscall.SIGKILL)
	run.wait(10 * time.Second)
	h.eventually(5*time.Second, "the handler to die with engine", func() bool { return !alive(pid) })
}
