package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
)

// Exit codes of handler commands.
const (
	exitSnooze = 75 // EX_TEMPFAIL: snooze (run again later), not a failure
)

// pipeLinger is how long a finished command's background children may
// keep its stdout or stderr open before the pipes are closed (and the
// children killed).
const pipeLinger = 2 * time.Second

// commandHandler runs a task as a command: the payload on stdin, the
// task's identity in ENGINE_TASK_* variables. Exit 0 is success, 75
// snoozes the task (snoozeDelay), anything else is a failure. When the
// task's context ends (timeout or shutdown) the whole process group gets
// SIGTERM, then SIGKILL after KillGrace; when the command exits, whatever
// is left of its group is killed.
type commandHandler struct {
	typ string
	set HandlerSettings
	env []string // os.Environ plus set.Env, computed once
	log *slog.Logger
	// maxResult bounds the stdout kept as the task's result (0: the
	// engine's default MaxResult).
	maxResult int
}

// newCommandHandler runs set.Command for tasks of type typ, with environ
// (engine's own environment) minus the engine's secrets, plus set.Env.
func newCommandHandler(typ string, set HandlerSettings, environ []string, log *slog.Logger) *commandHandler {
	env := handlerEnv(environ)
	names := make([]string, 0, len(set.Env))
	for k := range set.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		env = append(env, k+"="+set.Env[k])
	}
	return &commandHandler{typ: typ, set: set, env: env, log: log}
}

// handlerEnv is environ without the variables that configure how engine
// reaches Redis (ENGINE_REDIS_*: password, user, TLS key and certificate
// files, ...), the path of its config file (ENGINE_CONFIG, which may hold
// the password), redis-cli's password (REDISCLI_AUTH) and the HTTP tokens:
// a handler must not be able to print them into a log.
func handlerEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "ENGINE_REDIS_") || strings.HasPrefix(kv, envHTTPToken+"=") ||
			strings.HasPrefix(kv, envHTTPReadToken+"=") ||
			strings.HasPrefix(kv, envConfig+"=") || strings.HasPrefix(kv, "REDISCLI_AUTH=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ProcessTask runs the command once for t.
func (h *commandHandler) ProcessTask(ctx context.Context, t *engine.Task) error {
	if h.set.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.set.Timeout)
		defer cancel()
	}
	cmd := exec.Command(h.set.Command[0], h.set.Command[1:]...)
	cmd.Dir = h.set.Dir
	cmd.Env = append(h.env[:len(h.env):len(h.env)],
		"ENGINE_TASK_ID="+t.ID,
		"ENGINE_TASK_TYPE="+t.Type,
		"ENGINE_TASK_QUEUE="+t.Queue,
		"ENGINE_TASK_ATTEMPT="+strconv.Itoa(t.Attempt),
		"ENGINE_TASK_MAX_ATTEMPTS="+strconv.Itoa(t.MaxAttempts),
		"ENGINE_TASK_RECOVERIES="+strconv.Itoa(t.Recoveries),
		"ENGINE_TASK_SNOOZES="+strconv.Itoa(t.Snoozes),
		"ENGINE_TASK_DUE="+t.Due.UTC().Format(time.RFC3339Nano),
		"ENGINE_TASK_LAST_ERROR="+firstLine(t.LastError),
	)
	cmd.Stdin = bytes.NewReader(t.Payload)
	stdout, stderr := &cappedBuffer{max: h.set.OutputCap}, &cappedBuffer{max: h.set.OutputCap}
	limit := h.maxResult
	if limit <= 0 {
		limit = engine.DefaultConfig().MaxResult
	}
	result := &cappedBuffer{max: limit}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(stdout, result), io.MultiWriter(stderr, &progressLines{ctx: ctx, h: h, t: t})
	cmd.SysProcAttr = groupAttr()
	cmd.WaitDelay = pipeLinger

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", h.set.Command[0], err)
	}
	pgid := cmd.Process.Pid
	var mu sync.Mutex // orders the killer against the reaping of the command
	exited, lastSignal := false, ""
	signalGroup := func(sig syscall.Signal, name string) bool {
		mu.Lock()
		defer mu.Unlock()
		if exited {
			return false // the group id may belong to someone else now
		}
		lastSignal = name
		killGroup(pgid, sig)
		return true
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-stop:
			return
		case <-ctx.Done():
		}
		if !signalGroup(syscall.SIGTERM, "SIGTERM") {
			return
		}
		select {
		case <-stop:
		case <-time.After(h.set.KillGrace):
			signalGroup(syscall.SIGKILL, "SIGKILL")
		}
	}()
	err := cmd.Wait()
	mu.Lock()
	// The command has exited: whatever it left in its group goes too (as
	// systemd's KillMode=control-group), so no task leaks processes.
	// While any member lives, the group id cannot be reused.
	killGroup(pgid, syscall.SIGKILL)
	exited = true
	why := lastSignal
	mu.Unlock()
	close(stop)
	if errors.Is(err, exec.ErrWaitDelay) {
		h.log.Warn("task command left processes holding its output open; killed them", "task_id", t.ID, "type", t.Type)
		err = nil
	}
	h.logOutput(t, stdout, stderr, time.Since(start))
	if why == "" {
		err = h.result(err, stdout, stderr)
		if err == nil {
			h.keepResult(ctx, t, result)
		}
		return err
	}
	how := "stopped by SIGTERM"
	if why == "SIGKILL" {
		how = fmt.Sprintf("killed by SIGKILL: it ignored SIGTERM for kill_grace %v", h.set.KillGrace)
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, context.DeadlineExceeded) {
		return &stoppedError{fmt.Sprintf("command %s timed out after %v (%s)", h.set.Command[0], h.limit(ctx, t, start), how), cause}
	}
	return &stoppedError{fmt.Sprintf("command %s %s: the worker gave the task up (%v)", h.set.Command[0], how, cause), cause}
}

// keepResult records a succeeded command's stdout as the task's result:
// at most maxResult bytes, cut there with a warning that says so.
func (h *commandHandler) keepResult(ctx context.Context, t *engine.Task, out *cappedBuffer) {
	out.mu.Lock()
	b, total := out.buf.Bytes(), out.total
	out.mu.Unlock()
	if total > len(b) {
		h.log.Warn("task command's stdout is longer than max_result; its result keeps the start only",
			"task_id", t.ID, "type", t.Type, "stdout_bytes", total, "max_result", len(b))
	}
	if len(b) == 0 {
		return
	}
	if err := engine.SetResult(ctx, b); err != nil {
		h.log.Warn("task command's result not kept", "task_id", t.ID, "type", t.Type, "err", err)
	}
}

// stoppedError is a command stopped because its run's context ended; it
// unwraps to the context's cause (context.DeadlineExceeded on a timeout).
type stoppedError struct {
	msg   string
	cause error
}

func (e *stoppedError) Error() string { return e.msg }
func (e *stoppedError) Unwrap() error { return e.cause }

// limit is the time a run was allowed: the shorter of the task's timeout
// and the handler's, else what ctx's deadline left at start.
func (h *commandHandler) limit(ctx context.Context, t *engine.Task, start time.Time) time.Duration {
	d := t.Timeout
	if h.set.Timeout > 0 && (d == 0 || h.set.Timeout < d) {
		d = h.set.Timeout
	}
	if dl, ok := ctx.Deadline(); d == 0 && ok {
		d = dl.Sub(start).Round(10 * time.Millisecond)
	}
	return d
}

// result turns the command's exit into the handler's error.
func (h *commandHandler) result(err error, stdout, stderr *cappedBuffer) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("command %s: %w", h.set.Command[0], err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Errorf("command %s killed by %v%s", h.set.Command[0], ws.Signal(), excerpt(stderr))
	}
	if ee.ExitCode() == exitSnooze {
		return engine.Snooze(h.snoozeDelay(stdout))
	}
	return fmt.Errorf("command %s exited with status %d%s", h.set.Command[0], ee.ExitCode(), excerpt(stderr))
}

// progressLines reports the lines of a command's stderr that read
// "progress <number> [note]" as the task's progress (engine.SetProgress,
// which writes at most once a second, so a command may print them as
// often as it likes). Other lines are only logged.
type progressLines struct {
	ctx     context.Context
	h       *commandHandler
	t       *engine.Task
	partial []byte // an unfinished line, at most maxProgressLine bytes
	warned  bool
}

// maxProgressLine bounds the line a progress report is read from.
const maxProgressLine = 512

func (p *progressLines) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial = append(p.partial, b[:min(len(b), maxProgressLine-len(p.partial))]...)
			break
		}
		line := append(p.partial, b[:min(i, maxProgressLine-len(p.partial))]...)
		p.partial = p.partial[:0]
		b = b[i+1:]
		p.report(string(line))
	}
	return n, nil
}

func (p *progressLines) report(line string) {
	rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "progress ")
	if !ok {
		return
	}
	num, note, _ := strings.Cut(strings.TrimSpace(rest), " ")
	v, err := strconv.ParseFloat(num, 64)
	if err == nil {
		note = strings.ToValidUTF8(strings.TrimSpace(note), "?")
		for len(note) > 256 {
			_, size := utf8.DecodeLastRuneInString(note)
			note = note[:len(note)-size]
		}
		err = engine.SetProgress(p.ctx, v, note)
	}
	if err != nil && !p.warned {
		p.warned = true
		p.h.log.Warn("task command's progress line not understood (want: progress <number> [note])",
			"task_id", p.t.ID, "type", p.t.Type, "err", err)
	}
}

// snoozeDelay is how long an exit 75 snoozes the task: what the last line
// of stdout says when it is "snooze " and a duration ("snooze 90s"),
// else the handler's snooze setting.
func (h *commandHandler) snoozeDelay(stdout *cappedBuffer) time.Duration {
	out := strings.TrimRight(stdout.String(), "\n")
	last := out[strings.LastIndexByte(out, '\n')+1:]
	if v, ok := strings.CutPrefix(last, "snooze "); ok {
		if d, err := time.ParseDuration(strings.TrimSpace(v)); err == nil && d >= 0 {
			return d
		}
		h.log.Warn("task command's snooze line has no duration; using the handler's snooze", "line", firstLine(last))
	}
	return h.set.Snooze
}

func (h *commandHandler) logOutput(t *engine.Task, stdout, stderr *cappedBuffer, took time.Duration) {
	if stdout.total == 0 && stderr.total == 0 {
		return
	}
	h.log.Info("task output", "task_id", t.ID, "type", t.Type, "attempt", t.Attempt,
		"duration", took.Round(time.Millisecond),
		"stdout", strings.TrimSuffix(stdout.String(), "\n"), "stderr", strings.TrimSuffix(stderr.String(), "\n"))
}

// excerpt is the start of stderr for an error message.
func excerpt(b *cappedBuffer) string {
	s := strings.TrimSpace(b.buf.String())
	if s == "" {
		return ""
	}
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return ": " + s
}

// firstLine is s's first line, at most 1000 bytes, without NULs (an
// environment variable cannot hold one).
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > 1000 {
		s = s[:1000]
	}
	return s
}

// cappedBuffer keeps the first max bytes written to it and counts the rest.
type cappedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	max   int
	total int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += len(p)
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// String is what was kept, with a note of what was dropped.
func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if dropped := b.total - b.buf.Len(); dropped > 0 {
		s += fmt.Sprintf("...[%d bytes dropped]", dropped)
	}
	return s
}
