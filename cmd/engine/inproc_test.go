package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
)

// syncBuffer is a bytes.Buffer safe for the goroutines of an in-process run.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{} // closed by the next Write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote != nil {
		close(s.wrote)
		s.wrote = nil
	}
	return s.b.Write(p)
}

// next returns the buffer's contents and a channel closed by the next
// Write.
func (s *syncBuffer) next() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote == nil {
		s.wrote = make(chan struct{})
	}
	return s.b.String(), s.wrote
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// namespaceOf is the namespace inproc gave a.
func namespaceOf(a *app) string {
	for _, kv := range a.environ {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			return v
		}
	}
	return ""
}

// TestDemo runs a small demo in process and checks its summary.
func TestDemo(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuffer
	start := time.Now()
	code := run(context.Background(), []string{"demo", "--tasks", "80", "--spread", "2s", "--seed", "7"}, nil, &out, &errOut)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("demo exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if took > 20*time.Second {
		t.Errorf("demo of 80 tasks over 2s took %v", took)
	}
	s := out.String()
	for _, re := range []string{
		`tasks enqueued\s+80 \(79 to succeed, 1 to die\)`,
		`done\s+79 \(stats: processed 79\)`,
		`dead\s+1 \(stats: 1\)`,
		`retries\s+[1-9]\d* \(\d+ failures, [1-9]\d* asked to run later\)`,
		`on-time lateness\s+p50 \S+\s+p99 \S+\s+max \S+`,
		`ran early\s+0\n`, `ran twice\s+0\n`, `unexpected outcomes\s+0\n`, `lost\s+0\n`,
		`commands outside Redis 2.4: 0 \(sent: .*rpoplpush`,
		`demo: OK`,
	} {
		if !regexp.MustCompile(re).MatchString(s) {
			t.Errorf("demo output lacks %q:\n%s", re, s)
		}
	}
	a := &app{stdout: &out, stderr: &errOut}
	for _, bad := range [][]string{{"--tasks", "0"}, {"--spread", "-1s"}, {"extra"}, {"--log-level", "loud"}} {
		if code := a.main(context.Background(), append([]string{"demo"}, bad...)); code != exitUsage {
			t.Errorf("demo %v: exit %d, want %d", bad, code, exitUsage)
		}
	}
}

// inproc returns an app wired to a real Redis and a fresh namespace.
func inproc(t *testing.T, srv *redistest.Server, extra ...string) (*app, *syncBuffer, *syncBuffer) {
	var out, errOut syncBuffer
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) }) // a shared server keeps nothing of this test
	env := append([]string{"ENGINE_REDIS_ADDR=" + srv.Addr, "ENGINE_NAMESPACE=" + ns,
		"ENGINE_IDLE_WAIT=1s", "ENGINE_REDIS_READ_TIMEOUT=5s"}, append(passwordEnv(srv), extra...)...)
	return &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, environ: env}, &out, &errOut
}

// TestRunSignalsInProcess drives serve's two-signal shutdown in process
// (under the race detector when tests run with -race).
func TestRunSignalsInProcess(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	handlers := fmt.Sprintf(`{slow: {command: [sh, -c, 'touch %s; sleep 30']}}`, filepath.Join(dir, "started"))
	a, _, logs := inproc(t, srv, "ENGINE_HANDLERS="+handlers, "ENGINE_SHUTDOWN_TIMEOUT=1m")
	b, out, _ := inproc(t, srv)
	b.environ = a.environ
	b.stdin = strings.NewReader("payload from stdin")
	if code := b.main(context.Background(), []string{"enqueue", "--type", "slow", "--payload", "-"}); code != 0 {
		t.Fatalf("enqueue: exit %d", code)
	}
	id := strings.TrimSpace(out.String())

	ctx, stop := context.WithCancel(context.Background())
	force, forceNow := context.WithCancel(context.Background())
	defer forceNow()
	done := make(chan int)
	go func() { done <- a.main(withForce(ctx, force), []string{"run"}) }()
	testwait.Until(t, 10*time.Second, "the task to start", func() bool {
		_, err := os.Stat(filepath.Join(dir, "started"))
		return err == nil
	})
	stop()
	// The first signal is seen; had run exited on it, it would not log
	// the second (checked below).
	for log, wrote := logs.next(); !strings.Contains(log, "shutting down"); log, wrote = logs.next() {
		select {
		case code := <-done:
			t.Fatalf("run exited (%d) on the first signal despite a 1m shutdown_timeout", code)
		case <-wrote:
		case <-time.After(10 * time.Second):
			t.Fatalf("the first signal was not logged:\n%s", log)
		}
	}
	forceNow()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("run did not exit after the second signal")
	}
	if !strings.Contains(logs.String(), "second signal") {
		t.Errorf("run did not wait for the second signal:\n%s", logs.String())
	}
	out2 := &syncBuffer{}
	b.stdout = out2
	if code := b.main(context.Background(), []string{"lookup", id, "--json"}); code != 0 || !strings.Contains(out2.String(), `"state": "ready"`) {
		t.Errorf("lookup after forced stop: exit %d %s", code, out2.String())
	}
	if !strings.Contains(out2.String(), `"payload": "payload from stdin"`) {
		t.Errorf("payload not read from stdin: %s", out2.String())
	}
}

// TestStatsWatch: --watch refreshes until interrupted, redrawing only on
// a terminal: into a pipe it writes one table after another.
func TestStatsWatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, out, errOut := inproc(t, srv)
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--payload", "p", "--queue", "q1"}); code != 0 {
		t.Fatalf("enqueue: exit %d: %s", code, errOut.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- a.main(ctx, []string{"stats", "--watch=200ms"}) }()
	// It refreshes again and again, every 200ms: the third table comes
	// 400ms or more after the first.
	var first time.Time
	timeout := time.After(time.Minute)
	for s, wrote := out.next(); strings.Count(s, "every 200ms") < 3; s, wrote = out.next() {
		if first.IsZero() && strings.Contains(s, "every 200ms") {
			first = time.Now()
		}
		select {
		case code := <-done:
			t.Fatalf("stats --watch: exit %d before the interrupt: %s", code, errOut.String())
		case <-wrote:
		case <-timeout:
			t.Fatalf("stats --watch refreshed %d times in a minute", strings.Count(s, "every 200ms"))
		}
	}
	if between := time.Since(first); between < 400*time.Millisecond {
		t.Errorf("three refreshes within %v at --watch=200ms", between)
	}
	cancel()
	start := time.Now()
	if code := <-done; code != 0 {
		t.Fatalf("stats --watch: exit %d: %s", code, errOut.String())
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("--watch ran %v after the interrupt", took)
	}
	if strings.Contains(out.String(), "\x1b") {
		t.Errorf("--watch wrote terminal control codes into a pipe:\n%q", out.String())
	}
	if !regexp.MustCompile(`q1\s+1\s+0`).MatchString(out.String()) {
		t.Errorf("stats output lacks q1 with 1 ready:\n%s", out.String())
	}
	for _, bad := range [][]string{{"stats", "extra"}, {"stats", "--watch=1ms"}, {"stats", "--watch", "2s"}, {"enqueue"}, {"enqueue", "--type", "x", "--in", "1s", "--at", "2030-01-01T00:00:00Z"}, {"enqueue", "--type", "x", "--at", "tomorrow"}, {"lookup"}, {"dead"}, {"dead", "bury"}, {"dead", "retry"}} {
		if code := a.main(context.Background(), bad); code != exitUsage {
			t.Errorf("engine %v: exit %d, want %d", bad, code, exitUsage)
		}
	}
}
