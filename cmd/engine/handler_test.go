package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/testwait"
)

func testTask() *engine.Task {
	return &engine.Task{ID: "0b9f3c57-8a4e-4e63-9d8c-5b0e8f1b2a11", Queue: "q1", Type: "t1",
		Payload: []byte("hello payload"), Attempt: 2, MaxAttempts: 7, Due: time.Now()}
}

func newTestHandler(t *testing.T, argv []string, mod func(*HandlerSettings)) (*commandHandler, *bytes.Buffer) {
	t.Helper()
	set := defaultHandler()
	set.Command = argv
	set.Env["EXTRA"] = "extra-value"
	if mod != nil {
		mod(&set)
	}
	var logs bytes.Buffer
	return newCommandHandler("t1", set, os.Environ(), slog.New(slog.NewTextHandler(&logs, nil))), &logs
}

func TestHandlerSuccessGetsPayloadAndEnv(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	h, logs := newTestHandler(t, []string{"sh", "-c", `{ cat; echo; echo "$ENGINE_TASK_ID $ENGINE_TASK_TYPE $ENGINE_TASK_QUEUE $ENGINE_TASK_ATTEMPT $ENGINE_TASK_MAX_ATTEMPTS $EXTRA"; } > "$OUT"; echo to-stdout`},
		func(s *HandlerSettings) { s.Env["OUT"] = out })
	task := testTask()
	if err := h.ProcessTask(context.Background(), task); err != nil {
		t.Fatalf("ProcessTask: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := "hello payload\n" + task.ID + " t1 q1 2 7 extra-value\n"
	if string(b) != want {
		t.Errorf("command saw %q, want %q", b, want)
	}
	if !strings.Contains(logs.String(), "stdout=to-stdout") {
		t.Errorf("stdout not logged: %s", logs.String())
	}
}

func TestHandlerExitCodes(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandler(t, []string{"sh", "-c", "exit 75"}, func(s *HandlerSettings) { s.Snooze = 42 * time.Second })
	err := h.ProcessTask(context.Background(), testTask())
	if err == nil || err.Error() != engine.Snooze(42*time.Second).Error() {
		t.Errorf("exit 75: err = %v, want Snooze(42s)", err)
	}
	h, _ = newTestHandler(t, []string{"sh", "-c", "echo working; echo 'snooze 90s'; exit 75"}, func(s *HandlerSettings) { s.Snooze = 42 * time.Second })
	err = h.ProcessTask(context.Background(), testTask())
	if d, ok := engine.IsSnooze(err); !ok || d != 90*time.Second {
		t.Errorf("exit 75 after 'snooze 90s': err = %v, want Snooze(90s)", err)
	}
	h, _ = newTestHandler(t, []string{"sh", "-c", "echo 'snooze soon'; exit 75"}, func(s *HandlerSettings) { s.Snooze = 42 * time.Second })
	err = h.ProcessTask(context.Background(), testTask())
	if d, ok := engine.IsSnooze(err); !ok || d != 42*time.Second {
		t.Errorf("exit 75 after 'snooze soon': err = %v, want Snooze(42s)", err)
	}
	h, _ = newTestHandler(t, []string{"sh", "-c", "echo 'disk full' >&2; exit 3"}, nil)
	err = h.ProcessTask(context.Background(), testTask())
	if err == nil || !strings.Contains(err.Error(), "exited with status 3: disk full") {
		t.Errorf("exit 3: err = %v, want status 3 with stderr", err)
	}
	h, _ = newTestHandler(t, []string{filepath.Join(t.TempDir(), "no-such-command")}, nil)
	if err = h.ProcessTask(context.Background(), testTask()); err == nil || !strings.Contains(err.Error(), "start") {
		t.Errorf("missing command: err = %v", err)
	}
	h, _ = newTestHandler(t, []string{"sh", "-c", "kill -9 $$"}, nil)
	if err = h.ProcessTask(context.Background(), testTask()); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("killed command: err = %v", err)
	}
}

// readPIDs waits for file to hold n pids.
func readPIDs(t *testing.T, file string, n int) []int {
	t.Helper()
	var pids []int
	testwait.Until(t, 5*time.Second, fmt.Sprintf("%d pids in %s", n, file), func() bool {
		b, _ := os.ReadFile(file)
		pids = pids[:0]
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
			}
		}
		return len(pids) >= n
	})
	return pids
}

// awaitGone waits for pid, a process of a handler's group, to be gone; it
// kills one that is still there when the test ends.
func awaitGone(t *testing.T, pid int) {
	t.Helper()
	t.Cleanup(func() {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	testwait.Until(t, 2*time.Second, fmt.Sprintf("process %d of the group to die", pid), func() bool { return !alive(pid) })
}

// alive reports whether pid runs: exists and is not a zombie waiting for
// its new parent to reap it.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// TestHandlerTimeoutKillsGroup: the context ending kills the command and
// the children it started in the background.
func TestHandlerTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pids")
	h, _ := newTestHandler(t, []string{"sh", "-c", `sleep 30 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; wait`},
		func(s *HandlerSettings) { s.Env["PIDS"] = pidFile })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	task := testTask()
	task.Timeout = 300 * time.Millisecond // as the engine sets it: the message names it
	err := h.ProcessTask(ctx, task)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("took %v after a 300ms timeout", took)
	}
	if err == nil || !strings.Contains(err.Error(), "timed out after 300ms (stopped by SIGTERM)") ||
		strings.Contains(err.Error(), "deadline exceeded") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want \"timed out after 300ms (stopped by SIGTERM)\" matching context.DeadlineExceeded", err)
	}
	for _, pid := range readPIDs(t, pidFile, 2) {
		awaitGone(t, pid)
	}
}

// TestHandlerKillGrace: a command that ignores SIGTERM gets SIGKILL after
// kill_grace; the handler's own timeout applies too.
func TestHandlerKillGrace(t *testing.T) {
	t.Parallel()
	// The timeout must outlast the shell's start up to its trap: at 200 ms
	// a loaded machine's shell once took the SIGTERM before it set it.
	h, _ := newTestHandler(t, []string{"sh", "-c", `trap '' TERM; sleep 30 & wait; sleep 30`}, func(s *HandlerSettings) {
		s.Timeout = 2 * time.Second
		s.KillGrace = 300 * time.Millisecond
	})
	start := time.Now()
	err := h.ProcessTask(context.Background(), testTask())
	took := time.Since(start)
	if took < 2250*time.Millisecond || took > 8*time.Second {
		t.Errorf("took %v, want about timeout + kill grace (2.3s)", took)
	}
	if err == nil || !strings.Contains(err.Error(), "timed out after 2s (killed by SIGKILL: it ignored SIGTERM for kill_grace 300ms)") {
		t.Errorf("err = %v, want the timeout and the SIGKILL named", err)
	}
}

// TestHandlerEnvHasNoSecrets: a handler command does not see the
// variables that hold engine's Redis credentials and TLS files.
func TestHandlerEnvHasNoSecrets(t *testing.T) {
	t.Setenv("ENGINE_REDIS_PASSWORD", "s3cret")
	t.Setenv("ENGINE_REDIS_USER", "app")
	t.Setenv("ENGINE_REDIS_TLS_KEY_FILE", "/etc/engine/client.key")
	t.Setenv("KEPT_VARIABLE", "kept")
	out := filepath.Join(t.TempDir(), "env")
	h, _ := newTestHandler(t, []string{"sh", "-c", `env > "$OUT"`}, func(s *HandlerSettings) { s.Env["OUT"] = out })
	if err := h.ProcessTask(context.Background(), testTask()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := string(b)
	for _, secret := range []string{"s3cret", "ENGINE_REDIS_", "client.key"} {
		if strings.Contains(env, secret) {
			t.Errorf("handler environment contains %q:\n%s", secret, env)
		}
	}
	for _, want := range []string{"KEPT_VARIABLE=kept", "EXTRA=extra-value", "ENGINE_TASK_ID="} {
		if !strings.Contains(env, want) {
			t.Errorf("handler environment lacks %q", want)
		}
	}
}

// TestHandlerEnvHasNoConfigPath: a handler command is not told where
// engine's config file is (ENGINE_CONFIG: it may hold the Redis
// password), nor given redis-cli's password variable.
func TestHandlerEnvHasNoConfigPath(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "env")
	set := defaultHandler()
	set.Command = []string{"sh", "-c", `env > "$OUT"`}
	set.Env["OUT"] = out
	environ := []string{"PATH=" + os.Getenv("PATH"), "ENGINE_CONFIG=/etc/engine/secret-config.yaml",
		"REDISCLI_AUTH=s3cret", "ENGINE_REDIS_PASSWORD=s3cret", "KEPT_VARIABLE=kept"}
	h := newCommandHandler("t1", set, environ, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := h.ProcessTask(context.Background(), testTask()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := string(b)
	for _, secret := range []string{"secret-config.yaml", "ENGINE_CONFIG", "s3cret", "REDISCLI_AUTH"} {
		if strings.Contains(env, secret) {
			t.Errorf("handler environment contains %q:\n%s", secret, env)
		}
	}
	if !strings.Contains(env, "KEPT_VARIABLE=kept") {
		t.Errorf("handler environment lacks KEPT_VARIABLE:\n%s", env)
	}
}

func TestHandlerOutputCap(t *testing.T) {
	t.Parallel()
	h, logs := newTestHandler(t, []string{"sh", "-c", `i=0; while [ $i -lt 500 ]; do echo 0123456789abcdefghij; i=$((i+1)); done; echo err >&2`},
		func(s *HandlerSettings) { s.OutputCap = 100 })
	if err := h.ProcessTask(context.Background(), testTask()); err != nil {
		t.Fatal(err)
	}
	l := logs.String()
	if !strings.Contains(l, "[10400 bytes dropped]") || !strings.Contains(l, "stderr=err") {
		t.Errorf("log = %s, want 100 bytes kept and 10400 dropped", l)
	}
	b := cappedBuffer{max: 3}
	_, _ = b.Write([]byte("abcdef"))
	if got := b.String(); got != "abc...[3 bytes dropped]" {
		t.Errorf("capped = %q", got)
	}
}

// TestHandlerKillsLeftovers: processes a command leaves in its group are
// killed when it exits, whether or not they hold its output open.
func TestHandlerKillsLeftovers(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pids")
	h, logs := newTestHandler(t, []string{"sh", "-c", `sleep 30 >/dev/null 2>&1 & echo $! >> "$PIDS"; sleep 30 & echo $! >> "$PIDS"`},
		func(s *HandlerSettings) { s.Env["PIDS"] = pidFile })
	start := time.Now()
	if err := h.ProcessTask(context.Background(), testTask()); err != nil {
		t.Fatalf("ProcessTask: %v", err)
	}
	if took := time.Since(start); took > pipeLinger+time.Second {
		t.Errorf("took %v", took)
	}
	for _, pid := range readPIDs(t, pidFile, 2) {
		awaitGone(t, pid)
	}
	if !strings.Contains(logs.String(), "holding its output open") {
		t.Errorf("no warning about the process holding the output: %s", logs.String())
	}
}
