package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"go.uber.org/goleak"
)

// engineBin is the binary built once by TestMain; the end-to-end tests
// drive it as a user would.
var engineBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "engine-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	engineBin = filepath.Join(dir, "engine")
	// -trimpath: the packages compiled here are the ones
	// TestReadmeQuickStart's build, from another directory, finds in the
	// build cache.
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=v0.0.0-e2e", "-o", engineBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build engine: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// baseConfig keeps every wait short. %[1]q is the directory for the
// handlers' files.
const baseConfig = `
idle_wait: 1s
heartbeat_interval: 500ms
heartbeat_ttl: 2s
reap_interval: 500ms
shutdown_timeout: 1s
redis: {read_timeout: 5s}
log: {level: debug}
handlers:
  append:
    command: [sh, -c, 'printf "%%s %%s %%s\n" "$(cat)" "$ENGINE_TASK_ID" "$ENGINE_TASK_ATTEMPT" >> "$DIR/out"']
    env: {DIR: %[1]q}
  flaky:
    command: [sh, -c, 'if [ -f "$DIR/ok" ]; then echo "recovered $ENGINE_TASK_ID" >> "$DIR/out"; exit 0; fi; echo boom >&2; exit 3']
    env: {DIR: %[1]q}
  sleep:
    command: [sh, -c, 'echo $$ >> "$DIR/pids"; echo "started $ENGINE_TASK_ID" >> "$DIR/out"; sleep 30; echo "finished $ENGINE_TASK_ID" >> "$DIR/out"']
    env: {DIR: %[1]q}
  forever:
    command: [sh, -c, 'echo $$ > "$DIR/leader"; exec sleep 100000']
    env: {DIR: %[1]q}
  echo:
    command: [sh, -c, 'printf "hello %%s" "$(cat)"']
  steps:
    command: [sh, -c, 'echo "progress 1 of 2" >&2; echo "progress 2 of 2, all read" >&2; echo done']
  later:
    command: [sh, -c, 'echo "snoozes so far: $ENGINE_TASK_SNOOZES"; echo "snooze 1h"; exit 75']
  slow300:
    command: [sh, -c, 'echo "S $(date +%%s%%N)" >> "$DIR/spans"; sleep 0.3; echo "E $(date +%%s%%N)" >> "$DIR/spans"']
    env: {DIR: %[1]q}
`

// harness is one real redis-server (2.4 commands only), one config and
// one namespace for the binary.
type harness struct {
	t   *testing.T
	srv *redistest.Server
	dir string
	env []string
}

// opts go to redistest.Start: redistest.Private() for a test that stops
// or restarts the server, which ENGINE_TEST_REDIS's shared one must not be.
func newHarness(t *testing.T, opts ...redistest.Option) *harness {
	t.Parallel()
	h := &harness{t: t, srv: redistest.Start(t, opts...), dir: t.TempDir()}
	cfg := filepath.Join(h.dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(baseConfig, h.dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ENGINE_") {
			h.env = append(h.env, kv)
		}
	}
	ns := redistest.Namespace(t)
	t.Cleanup(func() { h.srv.Cleanup(t, ns) }) // a shared server keeps nothing of this test
	h.env = append(h.env, "ENGINE_CONFIG="+cfg, "ENGINE_REDIS_ADDR="+h.srv.Addr, "ENGINE_NAMESPACE="+ns)
	h.env = append(h.env, passwordEnv(h.srv)...)
	return h
}

// passwordEnv is the engine's password setting for srv: the shared
// server's ENGINE_TEST_REDIS_PASSWORD, if any; the servers redistest
// starts have none.
func passwordEnv(srv *redistest.Server) []string {
	if pw := os.Getenv(redistest.EnvPassword); srv.Kind == redistest.KindExternal && pw != "" {
		return []string{"ENGINE_REDIS_PASSWORD=" + pw}
	}
	return nil
}

// cli runs the binary to completion.
func (h *harness) cli(args ...string) (stdout, stderr string, code int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, engineBin, args...)
	cmd.Env = h.env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		h.t.Fatalf("engine %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// ok runs the binary and fails the test unless it exits 0.
func (h *harness) ok(args ...string) string {
	h.t.Helper()
	out, errOut, code := h.cli(args...)
	if code != 0 {
		h.t.Fatalf("engine %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func (h *harness) enqueue(args ...string) string {
	h.t.Helper()
	return strings.TrimSpace(h.ok(append([]string{"enqueue"}, args...)...))
}

func (h *harness) lookup(id string) taskJSON {
	h.t.Helper()
	var l taskJSON
	if err := json.Unmarshal([]byte(h.ok("lookup", id, "--json")), &l); err != nil {
		h.t.Fatal(err)
	}
	return l
}

func (h *harness) stats(queue string) queueStatsJSON {
	h.t.Helper()
	var st statsJSON
	if err := json.Unmarshal([]byte(h.ok("stats", "--json")), &st); err != nil {
		h.t.Fatal(err)
	}
	for _, q := range st.Queues {
		if q.Queue == queue {
			return q
		}
	}
	return queueStatsJSON{}
}

func (h *harness) file(name string) string {
	b, _ := os.ReadFile(filepath.Join(h.dir, name))
	return string(b)
}

// eventually polls cond until it holds or timeout passes.
func (h *harness) eventually(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	testwait.Until(h.t, timeout, what, cond)
}

// proc is a running `engine run`.
type proc struct {
	h    *harness
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
	code int
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// start starts the binary in the background with extra environment.
func (h *harness) start(env []string, args ...string) *proc {
	h.t.Helper()
	p := &proc{h: h, cmd: exec.Command(engineBin, args...), done: make(chan struct{})}
	p.cmd.Env = append(append([]string(nil), h.env...), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	h.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if h.t.Failed() {
			h.t.Logf("engine %v output:\n%s", args, p.log())
		}
	})
	return p
}

// startRun starts `engine run` and waits until its worker has started.
func (h *harness) startRun(env []string, args ...string) *proc {
	h.t.Helper()
	p := h.start(env, append([]string{"run"}, args...)...)
	h.eventually(10*time.Second, "engine run to start", func() bool {
		return strings.Contains(p.log(), "worker started") || strings.Contains(p.log(), "dispatcher started")
	})
	return p
}

// stop sends sig and returns the exit code and how long it took.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) (int, time.Duration) {
	p.h.t.Helper()
	start := time.Now()
	_ = p.cmd.Process.Signal(sig)
	return p.wait(timeout), time.Since(start)
}

func (p *proc) wait(timeout time.Duration) int {
	p.h.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.h.t.Fatalf("engine run did not exit within %v", timeout)
		return -1
	}
}

// TestE2EEnqueueRunStats: enqueue, run executes the command, stats and
// lookup show it done; payloads from stdin and scheduled tasks too.
func TestE2EEnqueueRunStats(t *testing.T) {
	h := newHarness(t)
	id := h.enqueue("--type", "append", "--payload", "hello")
	run := h.startRun(nil)
	h.eventually(10*time.Second, "the command to run", func() bool { return strings.Contains(h.file("out"), "hello "+id+" 1\n") })
	h.eventually(5*time.Second, "stats to show it processed", func() bool { return h.stats("default").Processed == 1 })
	if st := h.stats("default"); st.Ready != 0 || st.Running != 0 || st.Failed != 0 {
		t.Errorf("stats = %+v, want nothing left", st)
	}
	if l := h.lookup(id); l.State != "done" {
		t.Errorf("lookup = %+v, want done", l)
	}

	// Payload from stdin, and a task scheduled 1.5 s ahead on another queue.
	cmd := exec.Command(engineBin, "enqueue", "--type", "append", "--payload", "-")
	cmd.Env, cmd.Stdin = h.env, strings.NewReader("from-stdin")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	stdinID := strings.TrimSpace(string(out))
	enqueued := time.Now()
	later := h.enqueue("--type", "append", "--payload", "later", "--in", "1500ms")
	if l := h.lookup(later); l.State != "scheduled" {
		t.Errorf("lookup of a task due in 1.5s = %+v, want scheduled", l)
	}
	h.eventually(10*time.Second, "the stdin payload", func() bool { return strings.Contains(h.file("out"), "from-stdin "+stdinID) })
	h.eventually(10*time.Second, "the scheduled task", func() bool { return strings.Contains(h.file("out"), "later "+later) })
	if took := time.Since(enqueued); took < 1500*time.Millisecond {
		t.Errorf("scheduled task ran after %v, before its due time", took)
	}
	h.eventually(5*time.Second, "processed 3", func() bool { return h.stats("default").Processed == 3 })
	if !strings.Contains(run.log(), "task done") || !strings.Contains(run.log(), "task_id="+id) {
		t.Errorf("debug log lacks the Logging middleware's line for %s", id)
	}
	if code, took := run.stop(syscall.SIGTERM, 10*time.Second); code != 0 || took > 5*time.Second {
		t.Errorf("SIGTERM: exit %d after %v, want 0 promptly", code, took)
	}
}

// TestE2EProgressAndSnooze: a command's stderr lines "progress <n>
// [note]" are its task's progress; exit 75 with "snooze 1h" on stdout's
// last line snoozes the task for an hour without using an attempt; a
// task enqueued with --expire-in that passed never runs.
func TestE2EProgressAndSnooze(t *testing.T) {
	h := newHarness(t)
	steps := h.enqueue("--type", "steps")
	later := h.enqueue("--type", "later")
	// Expired long before the daemon below can start (a process start
	// takes far more than a millisecond).
	stale := h.enqueue("--type", "append", "--expire-in", "1ms")
	run := h.startRun(nil)
	// The last report is written by the worker's progress writer, just
	// after the run's result.
	h.eventually(10*time.Second, "the steps task done with its last report", func() bool {
		l := h.lookup(steps)
		return l.State == "done" && l.Progress != nil && l.Progress.Value == 2
	})
	l := h.lookup(steps)
	if l.Progress == nil || l.Progress.Value != 2 || l.Progress.Note != "of 2, all read" || l.Progress.At.IsZero() {
		t.Errorf("lookup of the steps task: progress %+v, want 2 \"of 2, all read\"", l.Progress)
	}
	h.eventually(10*time.Second, "the later task to be snoozed", func() bool { return h.lookup(later).Snoozes == 1 })
	l = h.lookup(later)
	if l.State != "scheduled" || l.Attempts != 0 || time.Until(l.Due) < 50*time.Minute {
		t.Errorf("lookup of the snoozed task = %+v, want scheduled an hour ahead with no attempt used", l)
	}
	h.eventually(10*time.Second, "the stale task to expire", func() bool { return h.lookup(stale).State == "dead" })
	if l := h.lookup(stale); !strings.HasPrefix(l.LastError, "expired: not started by") || l.Expires == nil {
		t.Errorf("lookup of the expired task = %+v, want dead as expired", l)
	}
	if strings.Contains(h.file("out"), stale) {
		t.Error("the expired task ran")
	}
	if st := h.stats("default"); st.Snoozed != 1 || st.Failed != 0 || st.Expired != 1 {
		t.Errorf("stats = %+v, want 1 snoozed, 1 expired and no failure", st)
	}
	if code, _ := run.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit %d", code)
	}
}

// TestE2ECancel: a task cancelled before its due time never runs.
func TestE2ECancel(t *testing.T) {
	h := newHarness(t)
	h.startRun(nil)
	// Due in 3 s: room for the cancel on a loaded machine.
	id := h.enqueue("--type", "append", "--payload", "cancelled", "--in", "3s")
	keep := h.enqueue("--type", "append", "--payload", "kept", "--in", "3s")
	if out := h.ok("cancel", id); !strings.Contains(out, "cancelled "+id) {
		t.Errorf("cancel printed %q", out)
	}
	h.eventually(10*time.Second, "the other task", func() bool { return strings.Contains(h.file("out"), "kept "+keep) })
	// Once nothing is scheduled, ready or running, the cancelled task can
	// no longer run: had it been due with the other, it would be one of
	// them or done by now.
	h.eventually(10*time.Second, "the queue to be empty", func() bool {
		st := h.stats("default")
		return st.Scheduled == 0 && st.Ready == 0 && st.Running == 0
	})
	if strings.Contains(h.file("out"), "cancelled") {
		t.Errorf("the cancelled task ran: %q", h.file("out"))
	}
	if l := h.lookup(id); l.State != "cancelled" {
		t.Errorf("lookup = %+v, want cancelled", l)
	}
	if _, errOut, code := h.cli("cancel", id); code != exitRefused || !strings.Contains(errOut, "already") {
		t.Errorf("second cancel: exit %d %q, want %d", code, errOut, exitRefused)
	}
	if _, _, code := h.cli("cancel", "6f1c1d9e-3a55-4a55-9d55-0d1c1d9e3a55"); code != exitNotFound {
		t.Errorf("cancel of an unknown id: exit %d, want %d", code, exitNotFound)
	}
	if st := h.stats("default"); st.Cancelled != 1 || st.Processed != 1 {
		t.Errorf("stats = %+v, want 1 cancelled, 1 processed", st)
	}
}

// TestE2EDeadLetters: a failing command retries, lands in the dead
// letters with its error; dead retry runs it again; purge deletes.
func TestE2EDeadLetters(t *testing.T) {
	h := newHarness(t)
	run := h.startRun(nil)
	id := h.enqueue("--type", "flaky", "--max-attempts", "3")
	var dead []taskJSON
	h.eventually(15*time.Second, "the task in the dead letters", func() bool {
		dead = nil
		_ = json.Unmarshal([]byte(h.ok("dead", "list", "--json")), &dead)
		return len(dead) == 1
	})
	if d := dead[0]; d.ID != id || d.Attempts != 3 || !strings.Contains(d.LastError, "status 3: boom") {
		t.Errorf("dead letter = %+v, want %s after 3 attempts with the command's error", d, id)
	}
	if st := h.stats("default"); st.Dead != 1 || st.Failed != 3 {
		t.Errorf("stats = %+v, want 1 dead, 3 failed", st)
	}
	for _, want := range []string{"task failed; will retry", "task failed; sent to the dead letters", "task_id=" + id, "attempt=3"} {
		if !strings.Contains(run.log(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if out := h.ok("dead", "list"); !strings.Contains(out, id) || !strings.Contains(out, "1 shown of 1") {
		t.Errorf("dead list = %q", out)
	}

	// Fix the cause, retry it: it runs again and succeeds.
	if err := os.WriteFile(filepath.Join(h.dir, "ok"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.ok("dead", "retry", id)
	h.eventually(10*time.Second, "the retried task to succeed", func() bool { return h.lookup(id).State == "done" })
	if !strings.Contains(h.file("out"), "recovered "+id) {
		t.Errorf("retried task did not run the command again")
	}
	if _, errOut, code := h.cli("dead", "retry", id); code != exitRefused || !strings.Contains(errOut, "the task is not dead (it is done)") {
		t.Errorf("retry of a task that is not dead: exit %d, want %d\n%s", code, exitRefused, errOut)
	}
	// Purge deletes dead letters only: a done task is refused and kept.
	if _, errOut, code := h.cli("dead", "purge", id); code != exitRefused || !strings.Contains(errOut, "not dead") {
		t.Errorf("purge of a task that is not dead: exit %d, want %d\n%s", code, exitRefused, errOut)
	}
	if st := h.lookup(id).State; st != "done" {
		t.Errorf("after a refused purge the task is %s, want done", st)
	}
	if _, errOut, code := h.cli("dead", "retry", "no-such-task"); code != exitNotFound || !strings.Contains(errOut, "there is no such task") {
		t.Errorf("retry of no task: exit %d, want %d\n%s", code, exitNotFound, errOut)
	}

	// Purge: two more dead letters, then --all.
	if err := os.Remove(filepath.Join(h.dir, "ok")); err != nil {
		t.Fatal(err)
	}
	a := h.enqueue("--type", "flaky", "--max-attempts", "1")
	b := h.enqueue("--type", "flaky", "--max-attempts", "1")
	h.eventually(10*time.Second, "two dead letters", func() bool { return h.lookup(a).State == "dead" && h.lookup(b).State == "dead" })
	h.ok("dead", "purge", a)
	if _, _, code := h.cli("lookup", a); code != exitNotFound {
		t.Errorf("lookup of a purged task: exit %d, want %d", code, exitNotFound)
	}
	if out := h.ok("dead", "purge", "--all"); !strings.Contains(out, "purged 1 dead letters") {
		t.Errorf("purge --all printed %q", out)
	}
	if _, _, code := h.cli("dead", "purge"); code != exitUsage {
		t.Errorf("purge without id or --all: exit %d, want %d", code, exitUsage)
	}
}
