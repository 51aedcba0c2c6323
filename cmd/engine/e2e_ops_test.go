package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// startSleeper enqueues a task whose command sleeps 30 s and waits until
// it runs; it returns the id and the command's process group.
func (h *harness) startSleeper() (string, int) {
	h.t.Helper()
	id := h.enqueue("--type", "sleep", "--timeout", "1m")
	h.eventually(10*time.Second, "the long task to start", func() bool { return strings.Contains(h.file("out"), "started "+id) })
	pgid, err := strconv.Atoi(strings.TrimSpace(h.file("pids")))
	if err != nil {
		h.t.Fatalf("pids file: %v", err)
	}
	if l := h.lookup(id); l.State != "running" {
		h.t.Fatalf("lookup = %+v, want running", l)
	}
	return id, pgid
}

// checkReturned checks that the task is ready again, never finished, and
// that its command's process group is gone.
func (h *harness) checkReturned(id string, pgid int) {
	h.t.Helper()
	if l := h.lookup(id); l.State != "ready" || l.Attempts != 0 {
		h.t.Errorf("after shutdown lookup = %+v, want ready with no failure counted", l)
	}
	if st := h.stats("default"); st.Ready != 1 || st.Running != 0 {
		h.t.Errorf("stats = %+v, want 1 ready, 0 running", st)
	}
	if strings.Contains(h.file("out"), "finished") {
		h.t.Errorf("the long task finished: shutdown waited for it")
	}
	h.eventually(3*time.Second, "the command's process group to die", func() bool { return syscall.Kill(-pgid, 0) != nil })
}

// TestE2EShutdownReturnsRunningTask: SIGTERM during a long task waits
// shutdown_timeout (1 s here), then returns the task to ready and exits.
func TestE2EShutdownReturnsRunningTask(t *testing.T) {
	h := newHarness(t)
	run := h.startRun(nil)
	id, pgid := h.startSleeper()
	code, took := run.stop(syscall.SIGTERM, 10*time.Second)
	if code != 0 || took > 3*time.Second {
		t.Errorf("SIGTERM: exit %d after %v, want 0 within a couple of seconds", code, took)
	}
	if took < 900*time.Millisecond {
		t.Errorf("exited after %v: did not give the task its shutdown_timeout of 1s", took)
	}
	h.checkReturned(id, pgid)
	if !strings.Contains(run.log(), "returning unfinished tasks") {
		t.Errorf("log does not say the task was returned")
	}
}

// TestE2ESecondSignalForces: with a long shutdown_timeout, a second
// signal returns the running task at once.
func TestE2ESecondSignalForces(t *testing.T) {
	h := newHarness(t)
	run := h.startRun([]string{"ENGINE_SHUTDOWN_TIMEOUT=60s"})
	id, pgid := h.startSleeper()
	_ = run.cmd.Process.Signal(syscall.SIGTERM)
	h.eventually(5*time.Second, "the first signal to be seen", func() bool { return strings.Contains(run.log(), "shutting down") })
	select {
	case <-run.done:
		t.Fatalf("exited on the first signal, before shutdown_timeout")
	default:
	}
	// Had it exited on the first signal, it would not log the second one
	// (checked below), and it would not have returned the task.
	code, took := run.stop(syscall.SIGINT, 10*time.Second)
	if code != 0 || took > 2*time.Second {
		t.Errorf("second signal: exit %d after %v, want 0 at once", code, took)
	}
	h.checkReturned(id, pgid)
	if !strings.Contains(run.log(), "second signal") {
		t.Errorf("log does not mention the second signal")
	}
}

// TestE2EWrongPassword: a password sent to a server that has none is a
// clear error and exit 2, for run and for client commands alike, and the
// hint says the server has no password (not "wrong password?").
func TestE2EWrongPassword(t *testing.T) {
	h := newHarness(t, redistest.Private()) // a server without a password, whatever the shared one has
	h.env = append(h.env, "ENGINE_REDIS_PASSWORD=wrong")
	for _, args := range [][]string{{"run"}, {"stats"}, {"enqueue", "--type", "x"}} {
		_, errOut, code := h.cli(args...)
		if code != exitUsage || !strings.Contains(errOut, "refused AUTH") || !strings.Contains(errOut, "has no password: remove redis.password") {
			t.Errorf("engine %v with a wrong password: exit %d, stderr %q; want %d naming AUTH and redis.password", args, code, errOut, exitUsage)
		}
	}
}

// TestE2EWaitsForRedis: run started before Redis logs that it waits,
// does not exit, and starts once Redis is up.
func TestE2EWaitsForRedis(t *testing.T) {
	h := newHarness(t, redistest.Private())
	h.srv.Stop(t)
	run := h.start(nil, "run")
	// It waits, backing off, and tries again: by its fourth try it has
	// outlived three failed PINGs.
	h.eventually(10*time.Second, "the fourth waiting log line", func() bool {
		return strings.Contains(run.log(), "waiting for Redis at "+h.srv.Addr) && strings.Contains(run.log(), "tries=4")
	})
	select {
	case <-run.done:
		t.Fatalf("run exited (code %d) while Redis was down", run.code)
	default:
	}
	h.srv.Restart(t)
	h.eventually(20*time.Second, "the worker to start", func() bool { return strings.Contains(run.log(), "worker started") })
	id := h.enqueue("--type", "append", "--payload", "after-outage")
	h.eventually(10*time.Second, "the task to run", func() bool { return strings.Contains(h.file("out"), "after-outage "+id) })
	if code, _ := run.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// TestE2ERoles: a process with --no-worker dispatches but runs nothing; a
// worker-only process runs what it dispatched.
func TestE2ERoles(t *testing.T) {
	h := newHarness(t)
	disp := h.startRun(nil, "--no-worker")
	if strings.Contains(disp.log(), "worker started") || !strings.Contains(disp.log(), "reaper") && !strings.Contains(disp.log(), "dispatcher started") {
		t.Errorf("--no-worker log:\n%s", disp.log())
	}
	id := h.enqueue("--type", "append", "--payload", "split", "--in", "300ms")
	h.eventually(5*time.Second, "the dispatcher to make it ready", func() bool { return h.lookup(id).State == "ready" })
	// No worker registered: nothing of that process can take the task.
	if ws := h.workers(); len(ws) != 0 {
		t.Fatalf("--no-worker registered workers %+v", ws)
	}
	if h.lookup(id).State != "ready" {
		t.Fatalf("a process without workers ran the task")
	}
	worker := h.startRun(nil, "--roles", "worker")
	h.eventually(10*time.Second, "the worker-only process to run it", func() bool { return h.lookup(id).State == "done" })
	if ws := h.workers(); len(ws) != 1 || ws[0].PID != worker.cmd.Process.Pid {
		t.Errorf("workers %+v, want only the worker-only process's (pid %d)", ws, worker.cmd.Process.Pid)
	}
	if strings.Contains(worker.log(), "dispatcher started") {
		t.Errorf("--roles worker started a dispatcher")
	}
	_, errOut, code := h.cli("run", "--roles", "worker", "--no-worker")
	if code != exitUsage || !strings.Contains(errOut, "every role is off") {
		t.Errorf("no roles: exit %d %q", code, errOut)
	}
}

// TestE2EBadConfig: bad settings stop the binary before it connects, with
// the key and line (or variable) named.
func TestE2EBadConfig(t *testing.T) {
	h := newHarness(t)
	bad := filepath.Join(h.dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("namespace: ok\nqueues:\n  - name: a\n    weight: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := h.cli("run", "--config", bad)
	if code != exitUsage || !strings.Contains(errOut, "bad.yaml:3: queues[0].weight: -1: want at least 1") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	h.env = append(h.env, "ENGINE_RESOLUTION=90s")
	_, errOut, code = h.cli("stats")
	if code != exitUsage || !strings.Contains(errOut, "env ENGINE_RESOLUTION: resolution") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = h.cli("stats", "--concurrency", "3")
	if code != exitUsage || !strings.Contains(errOut, "unknown flag: --concurrency") {
		t.Errorf("unknown flag: exit %d, stderr %q", code, errOut)
	}
}

// TestE2EHelp: help explains every command and flag; version prints the
// -ldflags version; completion scripts are generated.
func TestE2EHelp(t *testing.T) {
	h := newHarness(t)
	out := h.ok("help")
	for _, c := range (&app{}).newRootCmd().Commands() {
		if !strings.Contains(out, "  "+c.Name()+" ") {
			t.Errorf("engine help does not list %s", c.Name())
		}
	}
	// Every command sits in one of the groups, in the groups' order.
	at := 0
	for _, g := range commandGroups {
		i := strings.Index(out, "\n"+g.title+"\n")
		if i < at {
			t.Errorf("engine help: group %q missing or out of order:\n%s", g.title, out)
		}
		at = i
	}
	if strings.Contains(out, "Additional Commands:") {
		t.Errorf("engine help lists commands outside the groups:\n%s", out)
	}
	flags := map[string][]string{
		"run":         {"--config", "--redis", "--namespace", "--concurrency", "--log-level", "--queues", "--roles", "--no-worker", "--no-dispatcher", "--no-reaper"},
		"enqueue":     {"--queue", "--type", "--payload", "--payload-file", "--in", "--at", "--max-attempts", "--timeout"},
		"cancel":      {"--redis"},
		"lookup":      {"--json"},
		"stats":       {"--json", "--watch"},
		"dead list":   {"--json", "--limit"},
		"dead retry":  {"--all"},
		"queue pause": {"--redis"},
		"demo":        {"--tasks", "--spread"},
		"version":     nil,
	}
	for cmd, want := range flags {
		args := strings.Fields(cmd)
		usage := h.ok(append(args, "--help")...)
		if usage != h.ok(append([]string{"help"}, args...)...) {
			t.Errorf("engine help %s differs from engine %s --help", cmd, cmd)
		}
		if !strings.Contains(usage, "Usage:\n  engine "+cmd) {
			t.Errorf("%s --help: %q", cmd, usage)
		}
		for _, f := range want {
			if !strings.Contains(usage, "  "+f) && !strings.Contains(usage, ", "+f) {
				t.Errorf("%s --help does not explain %s", cmd, f)
			}
		}
	}
	if _, errOut, code := h.cli("frobnicate"); code != exitUsage || !strings.Contains(errOut, "unknown command") {
		t.Errorf("unknown command: exit %d %q", code, errOut)
	}
	for _, v := range []string{h.ok("version"), h.ok("--version")} {
		if !strings.HasPrefix(v, "engine v0.0.0-e2e") {
			t.Errorf("version = %q", v)
		}
	}
	if out := h.ok("completion", "bash"); !strings.Contains(out, "__start_engine") {
		t.Errorf("completion bash printed no completion script")
	}
}

// workers returns the registered workers.
func (h *harness) workers() []engine.WorkerInfo {
	h.t.Helper()
	var ws []engine.WorkerInfo
	if err := json.Unmarshal([]byte(h.ok("workers", "--json")), &ws); err != nil {
		h.t.Fatal(err)
	}
	return ws
}
