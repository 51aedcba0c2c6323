// Package redistest starts Redis servers for tests: a real redis-server whose
// default user may only run the Redis 2.4 command table, an external server
// named by ENGINE_TEST_REDIS, or a miniredis that refuses post-2.4 forms. Every
// connection handed out by [Server.Pool] is wrapped by redis24.Wrap, so a
// test fails as soon as the code under test sends something Redis 2.4 would
// not accept.
package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// Kinds of [Server].
const (
	KindReal      = "real"      // a redis-server child process started by Start
	KindExternal  = "external"  // the server named by ENGINE_TEST_REDIS
	KindMiniredis = "miniredis" // an in-process miniredis started by Mini
)

// Environment variables read by [Start].
const (
	EnvAddr     = "ENGINE_TEST_REDIS"          // host:port of an external server
	EnvPassword = "ENGINE_TEST_REDIS_PASSWORD" // its password (AUTH password), if any
	EnvBinary   = "REDIS_SERVER"               // path of redis-server, default from PATH
	// EnvBinary24 is the path of a real Redis 2.4 redis-server, for
	// [Start24]; the tests that need it skip, saying so, without it.
	EnvBinary24 = "REDIS24_SERVER"
)

const (
	startTimeout = 10 * time.Second // wait this long for a new server to answer PING
	stopTimeout  = 5 * time.Second  // SIGTERM, then SIGKILL after this long
	startTries   = 5                // ports tried when the chosen one is taken
)

// Server is a Redis server for one test.
type Server struct {
	// Addr is host:port.
	Addr string
	// Kind is KindReal, KindExternal or KindMiniredis.
	Kind string
	// Mini is the miniredis instance, nil unless Kind is KindMiniredis.
	Mini *miniredis.Miniredis
	// Census records the commands sent through Pool connections and every
	// violation, refused by Wrap or (for miniredis) by the server hook.
	Census *redis24.Census

	password      string // AUTH password of the external server
	adminPassword string // password of the "admin" ACL user (real servers)
	adminToken    string // marker that exempts Admin conns from the miniredis hook

	// real servers only
	v24               bool // a Redis 2.4 server (Start24): config file, no ACL
	bin, dir, logPath string
	port              int
	args              []string
	mu                sync.Mutex
	proc              *process // nil when stopped
}

type config struct {
	appendOnly bool
	extra      []string
	private    bool
}

// Option configures [Start].
type Option func(*config)

// WithAppendOnly turns on the AOF with appendfsync always, so that data
// survives Kill and Restart. It implies [Private].
func WithAppendOnly() Option { return func(c *config) { c.appendOnly, c.private = true, true } }

// WithArgs appends raw redis-server arguments, e.g. WithArgs("--timeout", "1").
// It implies [Private].
func WithArgs(args ...string) Option {
	return func(c *config) { c.extra, c.private = append(c.extra, args...), true }
}

// Private asks for a server of the test's own even when ENGINE_TEST_REDIS
// names a shared one: for tests that stop, kill or restart the server, cut
// or kill its connections, or read figures (INFO, census totals) that other
// tests sharing a server would disturb.
func Private() Option { return func(c *config) { c.private = true } }

// Start returns a real Redis server for t. If ENGINE_TEST_REDIS is set and no
// option asks for a private server ([Private], [WithAppendOnly], [WithArgs]),
// it uses that server (Kind "external"; nothing is started; tests isolate
// themselves there by [Namespace]). Otherwise it starts redis-server
// (REDIS_SERVER or PATH) on a free loopback port in t.TempDir(), with the
// default user restricted to the Redis 2.4 command table and an "admin" user
// for [Server.Admin]. The server is stopped in t.Cleanup. A missing
// redis-server fails the test; it never skips.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if addr := os.Getenv(EnvAddr); addr != "" && !cfg.private {
		return &Server{Addr: addr, Kind: KindExternal, Census: redis24.NewCensus(), password: os.Getenv(EnvPassword)}
	}
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("redistest: %v; install it (e.g. `apt-get install -y redis-server`), "+
			"set %s to its path, or set %s=host:port to use a running server", err, EnvBinary, EnvAddr)
	}
	s := &Server{
		Kind:          KindReal,
		Census:        redis24.NewCensus(),
		adminPassword: randomHex(16),
		bin:           bin,
		dir:           t.TempDir(),
	}
	s.logPath = filepath.Join(s.dir, "redis.log")
	s.args = serverArgs(s.dir, s.adminPassword, cfg)
	t.Cleanup(s.stop)
	s.launchOnFreePort(t)
	return s
}

// Start24 returns a real Redis 2.4 server of t's own, started from the
// binary that REDIS24_SERVER names, on a free loopback port in t.TempDir()
// and stopped in t.Cleanup. Redis 2.4 has no ACL: every connection may run
// every command, and only the redis24.Wrap guard of [Server.Pool] keeps
// the code under test to the 2.4 table. Options are as for [Start]
// (WithArgs' "--name value" pairs become config-file lines). Without
// REDIS24_SERVER the test is skipped with a message saying that it did not
// run on Redis 2.4: never a silent pass. A set but missing binary fails.
func Start24(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := os.Getenv(EnvBinary24)
	if bin == "" {
		t.Skipf("redistest: %s is not set: this test did not run on a real Redis 2.4 "+
			"(set it to the path of a Redis 2.4 redis-server)", EnvBinary24)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("redistest: %s=%s: %v", EnvBinary24, bin, err)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{Kind: KindReal, v24: true, Census: redis24.NewCensus(), bin: bin, dir: t.TempDir()}
	s.logPath = filepath.Join(s.dir, "redis.log")
	s.args = configLines24(s.dir, cfg)
	t.Cleanup(s.stop)
	s.launchOnFreePort(t)
	return s
}

// launchOnFreePort starts s on a free loopback port, trying another when
// the one chosen was taken meanwhile; it fails t when none works.
func (s *Server) launchOnFreePort(t testing.TB) {
	t.Helper()
	var lastErr error
	for try := 0; try < startTries; try++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.port, s.Addr = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(); lastErr == nil {
			return
		}
		if !strings.Contains(lastErr.Error(), "in use") {
			break
		}
	}
	t.Fatalf("redistest: %v", lastErr)
}

// configLines24 is a Redis 2.4 config file, but for its port line: 2.4
// takes no --option arguments.
func configLines24(dir string, cfg config) []string {
	lines := []string{"bind 127.0.0.1", "dir " + dir, "daemonize no", "loglevel notice"}
	if cfg.appendOnly {
		lines = append(lines, "appendonly yes", "appendfsync always")
	} else {
		lines = append(lines, "appendonly no")
	}
	var cur []string
	for _, a := range cfg.extra {
		if strings.HasPrefix(a, "--") {
			if len(cur) > 0 {
				lines = append(lines, strings.Join(cur, " "))
			}
			cur = []string{strings.TrimPrefix(a, "--")}
			continue
		}
		cur = append(cur, a)
	}
	if len(cur) > 0 {
		lines = append(lines, strings.Join(cur, " "))
	}
	return lines
}

// Is24 reports whether s is a real Redis 2.4 started by [Start24].
func (s *Server) Is24() bool { return s.v24 }

func findRedisServer() (string, error) {
	if bin := os.Getenv(EnvBinary); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBinary, bin, err)
		}
		return bin, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found: %w", err)
	}
	return bin, nil
}

// aclSubcommands narrows container commands to the subcommands 2.4 had.
var aclSubcommands = map[string][]string{
	"config":  {"get", "set", "resetstat"},
	"client":  {"list", "kill"},
	"object":  {"refcount", "encoding", "idletime"},
	"slowlog": {"get", "len", "reset"},
}

// AOFReplayRule is the rule a server that replays an append-only file
// adds to ACLRules for its default user. Redis 7.0 writes EXPIRE into the
// file as PEXPIREAT (a 2.6 command) and replays a transaction's commands
// at start as the default user: without the rule, every restart drops the
// EXPIREs of the transactions it replays (each refused with NOPERM, the
// rest of the transaction run), and keys written with a TTL before the
// restart keep theirs no more. The clients' own 2.4 guard (redis24.Wrap)
// still refuses PEXPIREAT, and servers that do not persist keep the
// table exact.
const AOFReplayRule = "+pexpireat"

// ACLRules returns the ACL rules that limit a Redis 6+ user to the Redis 2.4
// command table: "-@all" then "+cmd" (or "+cmd|sub") for each allowed name.
func ACLRules() []string {
	rules := []string{"-@all"}
	for _, name := range redis24.Commands() {
		if subs, ok := aclSubcommands[name]; ok {
			for _, sub := range subs {
				rules = append(rules, "+"+name+"|"+sub)
			}
			continue
		}
		rules = append(rules, "+"+name)
	}
	return rules
}

func serverArgs(dir, adminPassword string, cfg config) []string {
	args := []string{"--bind", "127.0.0.1", "--save", "", "--dir", dir}
	if cfg.appendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, "--user", "default", "on", "nopass", "~*", "&*")
	args = append(args, ACLRules()...)
	if cfg.appendOnly {
		args = append(args, AOFReplayRule)
	}
	args = append(args, "--user", "admin", "on", ">"+adminPassword, "~*", "&*", "+@all")
	return append(args, cfg.extra...)
}

// freePort asks the kernel for a free loopback port. Another process may take
// it before redis-server binds it; Start then retries with a new port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("redistest: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

// process is a running redis-server; done is closed once it has been reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, valid after done is closed
}

// launch starts redis-server on s.port and waits until it answers PING.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("server is already running")
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	defer logf.Close() // the child keeps its own descriptor
	logStart, _ := logf.Seek(0, io.SeekEnd)

	args := append([]string{"--port", strconv.Itoa(s.port)}, s.args...)
	if s.v24 {
		conf := filepath.Join(s.dir, "redis.conf")
		text := "port " + strconv.Itoa(s.port) + "\n" + strings.Join(s.args, "\n") + "\n"
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", conf, err)
		}
		args = []string{conf}
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	if err := waitReady(s.Addr, p); err != nil {
		terminate(p)
		return fmt.Errorf("redis-server on %s did not start: %w\n--- server log ---\n%s", s.Addr, err, s.logSince(logStart))
	}
	s.proc = p
	return nil
}

// waitReady asks addr for INFO until the server that answers is p (its
// process_id) and has loaded its data set (loading:0: after a restart from
// an append-only file it answers LOADING until then), or p exits. Another test's server may hold the port that
// freePort chose (p then fails to bind and exits): a PING alone would take
// that server for p.
func waitReady(addr string, p *process) error {
	deadline := time.Now().Add(startTimeout)
	pid := int64(p.cmd.Process.Pid)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("process exited: %v", p.err)
		default:
		}
		c, err := redis.Dial("tcp", addr, redis.DialConnectTimeout(time.Second),
			redis.DialReadTimeout(time.Second), redis.DialWriteTimeout(time.Second))
		if err == nil {
			var info string
			info, err = redis.String(c.Do("INFO"))
			c.Close()
			if err == nil {
				got, _ := redisinfo.Int(info, "process_id")
				loading, _ := redisinfo.Field(info, "loading")
				switch {
				case got == pid && loading == "0":
					return nil
				case got == pid:
					err = fmt.Errorf("%s is still loading its data set", addr)
				default:
					err = fmt.Errorf("another server answers on %s", addr)
				}
			}
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no answer from the new server within %v: %v", startTimeout, lastErr)
}

func (s *Server) logSince(off int64) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", s.logPath, err)
	}
	if off > int64(len(b)) {
		off = 0
	}
	return string(b[off:])
}

// terminate sends SIGTERM, then SIGKILL after stopTimeout, and waits for the
// process to be reaped.
func terminate(p *process) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (s *Server) requireReal(t testing.TB, op string) {
	t.Helper()
	if s.Kind != KindReal {
		t.Fatalf("redistest: %s needs a server started by Start without %s (this one is %q)", op, EnvAddr, s.Kind)
	}
}

// stop terminates the process if it runs; it is the t.Cleanup of Start.
func (s *Server) stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		terminate(p)
	}
}

// Stop shuts the server down gracefully (SIGTERM; SIGKILL after 5 s). Real
// servers only; stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.requireReal(t, "Stop")
	s.stop()
}

// Kill kills the server with SIGKILL, as a crash would, and reaps it. Real
// servers only.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.requireReal(t, "Kill")
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Restart stops the server if it runs (gracefully) and starts it again on the
// same port and directory, so AOF data (see WithAppendOnly) is reloaded.
// Pooled connections to the old process are dead afterwards; the first
// command on each fails. Real servers only.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.requireReal(t, "Restart")
	s.stop()
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}
