package compat_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// The child worker process: the test binary run again with
// -test.run=^TestHelperProcess$ and these variables. It runs one Worker on
// the parent's server and namespace and reports on stdout:
//
//	WORKER <worker id>                  before the worker starts
//	POPPED <task id>                    when it took a task (with a claim gate)
//	RUNNING <task id> <attempt> <recoveries>   when a "block" handler starts
//	BEATS OVER                          when the first heartbeat past the allowed ones fails
//
// "block" handlers never return; the parent SIGKILLs the process.
const (
	envHelper        = "COMPAT_HELPER_PROCESS" // "worker" in a child
	envChildAddr     = "COMPAT_CHILD_ADDR"
	envChildPassword = "COMPAT_CHILD_PASSWORD"
	// Set: COMPAT_CHILD_ADDR is a seed node of a Redis Cluster, reached
	// through a topology pool for the namespace's slot (cluster_test.go).
	envChildCluster     = "COMPAT_CHILD_CLUSTER"
	envChildNamespace   = "COMPAT_CHILD_NAMESPACE"
	envChildConcurrency = "COMPAT_CHILD_CONCURRENCY"
	// Heartbeats after this many successful ones fail as if the connection
	// dropped (0: all succeed): a worker that is alive but cut off.
	envChildBeats = "COMPAT_CHILD_BEATS"
	// After taking a task (RPOPLPUSH) the worker waits for this file to
	// exist before it claims the task.
	envChildClaimGate = "COMPAT_CHILD_CLAIM_GATE"
	// Redis 2.4 violations are appended to this file, one a line.
	envChildViolations = "COMPAT_CHILD_VIOLATIONS"
)

// Child heartbeat settings: the brief's 200ms interval and 1s TTL.
const (
	childHeartbeatInterval = 200 * time.Millisecond
	childHeartbeatTTL      = time.Second
)

// TestHelperProcess is the child worker process; in a normal run it does
// nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "worker" {
		return
	}
	// An orphan must not outlive a parent that died without killing it.
	time.AfterFunc(2*time.Minute, func() { os.Exit(3) })
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	vf, err := os.OpenFile(os.Getenv(envChildViolations), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var vmu sync.Mutex
	onViolation := func(v *redis24.Violation) {
		vmu.Lock()
		defer vmu.Unlock()
		fmt.Fprintf(vf, "%v (sent: %s %s)\n", v, v.Command, strings.Join(v.Args, " "))
	}

	f := &faults{}
	if limit, _ := strconv.Atoi(os.Getenv(envChildBeats)); limit > 0 {
		var beats atomic.Int64
		f.failExec = func(v txnView) error {
			if len(v.Queued) > 0 && v.Queued[0].is("SETEX") && strings.Contains(argString(v.Queued[0].Args[0]), "}:hb:") {
				if n := beats.Add(1); n > int64(limit) {
					if n == int64(limit)+1 {
						say("BEATS OVER")
					}
					return errLostConnection
				}
			}
			return nil
		}
	}
	if os.Getenv(envChildClaimGate) == "true" {
		// The gate opens when the test closes the child's stdin.
		var gate sync.Once
		f.afterDo = func(c cmd, reply interface{}) {
			if !c.is("RPOPLPUSH") || reply == nil {
				return
			}
			id, _ := redis.String(reply, nil)
			say("POPPED %s", id)
			gate.Do(func() { _, _ = io.Copy(io.Discard, os.Stdin) })
		}
	}
	addr, password := os.Getenv(envChildAddr), os.Getenv(envChildPassword)
	census := redis24.NewCensus()
	pool := &redis.Pool{
		MaxIdle: 8,
		Dial: func() (redis.Conn, error) {
			c, err := dialServer(addr, password)
			if err != nil {
				return nil, err
			}
			return f.wrap(redis24.Wrap(c, redis24.OnViolation(onViolation), redis24.WithCensus(census))), nil
		},
	}
	if os.Getenv(envChildCluster) != "" {
		pool = childClusterPool(t, addr, os.Getenv(envChildNamespace), func(c redis.Conn) redis.Conn {
			return f.wrap(redis24.Wrap(c, redis24.OnViolation(onViolation), redis24.WithCensus(census)))
		})
	}
	concurrency, _ := strconv.Atoi(os.Getenv(envChildConcurrency))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv(envLog) != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg := baseConfig(os.Getenv(envChildNamespace), log)
	cfg.Advanced.HeartbeatInterval, cfg.Advanced.HeartbeatTTL = childHeartbeatInterval, childHeartbeatTTL
	cfg.Concurrency = max(1, concurrency)
	mux := engine.NewMux()
	mux.HandleFunc("block", func(ctx context.Context, task *engine.Task) error {
		say("RUNNING %s %d %d", task.ID, task.Attempt, task.Recoveries)
		select {} // until SIGKILL
	})
	w, err := enginehook.NewWorker(pool, cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	say("WORKER %s", w.ID())
	_ = w.Run(context.Background())
	t.Fatal("the child worker stopped on its own")
}

// childOpts configures a child worker process.
type childOpts struct {
	concurrency int
	beats       int  // successful heartbeats allowed, 0: all
	claimGate   bool // wait between taking and claiming a task until openGate
}

// child is a running child worker process.
type child struct {
	e          *env
	cmd        *exec.Cmd
	id         string
	violations string
	stderr     bytes.Buffer

	gate io.WriteCloser // the child's stdin, with a claim gate

	mu      sync.Mutex
	lines   []string
	used    []bool
	eof     bool
	killed  bool
	changed testwait.Pulse // a line came, or the end
}

// openGate lets the child claim what it takes (childOpts.claimGate).
func (ch *child) openGate() {
	ch.e.t.Helper()
	if err := ch.gate.Close(); err != nil {
		ch.e.t.Fatal(err)
	}
}

// startChild starts a child worker process on the scenario's server and
// namespace and waits for it to name its worker. It is killed at the end of
// the scenario at the latest.
func (e *env) startChild(o childOpts) *child {
	t := e.t
	t.Helper()
	ch := &child{e: e, violations: t.TempDir() + "/violations"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(),
		envHelper+"=worker",
		envChildAddr+"="+e.srv.Addr,
		envChildPassword+"="+serverPassword(e.srv),
		envChildCluster+"="+childClusterFlag(e.srv),
		envChildNamespace+"="+e.ns,
		envChildConcurrency+"="+strconv.Itoa(max(1, o.concurrency)),
		envChildBeats+"="+strconv.Itoa(o.beats),
		envChildClaimGate+"="+strconv.FormatBool(o.claimGate),
		envChildViolations+"="+ch.violations,
	)
	cmd.Stderr = &lockedWriter{w: &ch.stderr}
	if o.claimGate {
		var err error
		if ch.gate, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child worker: %v", err)
	}
	ch.cmd = cmd
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ch.mu.Lock()
			ch.lines = append(ch.lines, sc.Text())
			ch.used = append(ch.used, false)
			ch.mu.Unlock()
			ch.changed.Beat()
		}
		ch.mu.Lock()
		ch.eof = true
		ch.mu.Unlock()
		ch.changed.Beat()
	}()
	t.Cleanup(ch.kill)
	ch.id = strings.TrimPrefix(ch.waitLine("WORKER ", 30*time.Second), "WORKER ")
	return ch
}

// waitLine returns the first line not yet returned that starts with prefix,
// waiting for it up to timeout. It must be called from the test goroutine.
func (ch *child) waitLine(prefix string, timeout time.Duration) string {
	t := ch.e.t
	t.Helper()
	deadline := time.After(timeout)
	for {
		next := ch.changed.Wait()
		ch.mu.Lock()
		for i, l := range ch.lines {
			if !ch.used[i] && strings.HasPrefix(l, prefix) {
				ch.used[i] = true
				ch.mu.Unlock()
				return l
			}
		}
		eof := ch.eof
		ch.mu.Unlock()
		if eof {
			t.Fatalf("child worker: exited without a %q line; stderr:\n%s", prefix, ch.stderrText())
		}
		select {
		case <-next:
		case <-deadline:
			t.Fatalf("child worker: no %q line after %v; stderr:\n%s", prefix, timeout, ch.stderrText())
		}
	}
}

// hasLine reports, without waiting, whether the child printed a line
// starting with prefix.
func (ch *child) hasLine(prefix string) (string, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for _, l := range ch.lines {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

func (ch *child) stderrText() string {
	w := ch.cmd.Stderr.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return ch.stderr.String()
}

// kill SIGKILLs the child, as a crash would, reaps it and reports the Redis
// 2.4 violations it recorded.
func (ch *child) kill() {
	ch.mu.Lock()
	if ch.killed {
		ch.mu.Unlock()
		return
	}
	ch.killed = true
	ch.mu.Unlock()
	_ = ch.cmd.Process.Signal(syscall.SIGKILL)
	_ = ch.cmd.Wait()
	b, _ := os.ReadFile(ch.violations)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		ch.e.t.Errorf("child worker: command not valid for Redis 2.4: %s", line)
		k := ch.e.kind
		k.mu.Lock()
		k.childV = append(k.childV, line)
		k.mu.Unlock()
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
