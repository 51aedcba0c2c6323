package redistest_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recordingTB captures Errorf calls instead of failing the test, to check
// that violations are reported.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...interface{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

func TestStartRealServerAndPool(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	s := redistest.Start(t)
	if s.Kind != redistest.KindReal || s.Mini != nil {
		t.Fatalf("Kind = %q, Mini = %v; want a real server", s.Kind, s.Mini)
	}
	if host, _, err := net.SplitHostPort(s.Addr); err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr = %q (%v), want 127.0.0.1:port", s.Addr, err)
	}
	ns := redistest.Namespace(t)
	if !regexp.MustCompile(`^t[0-9a-f]{8}$`).MatchString(ns) {
		t.Errorf("Namespace = %q, want t + 8 hex digits", ns)
	}

	conn := s.Pool(t).Get()
	defer conn.Close()
	if _, err := conn.Do("SETEX", ns+":k", 10, "v"); err != nil {
		t.Fatalf("SETEX: %v", err)
	}
	if v, err := redis.String(conn.Do("GET", ns+":k")); err != nil || v != "v" {
		t.Fatalf("GET = %q, %v", v, err)
	}
	if _, err := conn.Do("RPUSH", ns+":q", "job"); err != nil {
		t.Fatal(err)
	}
	if v, err := redis.String(redis.DoWithTimeout(conn, 3*time.Second, "BRPOPLPUSH", ns+":q", ns+":w", 1)); err != nil || v != "job" {
		t.Fatalf("BRPOPLPUSH = %q, %v", v, err)
	}
	if v, err := redis.String(conn.Do("LINDEX", ns+":w", 0)); err != nil || v != "job" {
		t.Fatalf("LINDEX = %q, %v", v, err)
	}
	redistest.RequireNoViolations(t, s)
	want := []string{"brpoplpush", "get", "lindex", "rpush", "setex"}
	if got := strings.Join(redistest.CensusCommands(s), ","); got != strings.Join(want, ",") {
		t.Errorf("CensusCommands = %s, want %v", got, want)
	}
}

func TestDefaultUserIsRestrictedTo24(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	s := redistest.Start(t)
	// A raw, unwrapped connection as the default user proves the ACL itself.
	raw, err := redis.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, args := range [][]interface{}{
		{"EVAL", "return 1", 0}, {"UNLINK", "k"}, {"SCAN", 0}, {"CONFIG", "REWRITE"},
		{"CLIENT", "SETNAME", "x"}, {"OBJECT", "FREQ", "k"},
	} {
		_, err := raw.Do(args[0].(string), args[1:]...)
		if err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Errorf("%v as default user = %v, want NOPERM", args, err)
		}
	}
	if _, err := raw.Do("CONFIG", "GET", "maxmemory"); err != nil {
		t.Errorf("CONFIG GET as default user = %v", err)
	}

	admin := s.Admin(t)
	if _, err := admin.Do("EVAL", "return 1", 0); err != nil {
		t.Errorf("EVAL as admin = %v", err)
	}
	if _, err := admin.Do("FLUSHDB"); err != nil {
		t.Errorf("FLUSHDB as admin = %v", err)
	}
	if _, err := admin.Do("CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
		t.Errorf("CONFIG SET as admin = %v", err)
	}
	if len(s.Census.Commands()) != 0 {
		t.Errorf("unguarded connections were counted: %v", s.Census.Commands())
	}
}

func TestPoolRefusesAndReports(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	s := redistest.Start(t)
	rec := &recordingTB{TB: t}
	conn := s.Pool(rec).Get()
	defer conn.Close()
	if _, err := conn.Do("SET", "k", "v", "EX", 10); !errors.Is(err, redis24.ErrNot24) {
		t.Fatalf("SET k v EX 10 = %v, want a violation", err)
	}
	if n, err := redis.Int(s.Admin(t).Do("EXISTS", "k")); err != nil || n != 0 {
		t.Errorf("EXISTS k = %d, %v: the refused SET reached the server", n, err)
	}
	if errs := rec.errors(); len(errs) != 1 || !strings.Contains(errs[0], "SET with EX option") {
		t.Errorf("reported %q, want one SET EX violation", errs)
	}
	if len(s.Census.Violations()) != 1 {
		t.Errorf("census violations = %v", s.Census.Violations())
	}
}

func TestRestartKeepsAOFData(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	s := redistest.Start(t, redistest.WithAppendOnly(), redistest.WithArgs("--timeout", "7"))
	admin := s.Admin(t)
	if v, err := redis.Strings(admin.Do("CONFIG", "GET", "timeout")); err != nil || len(v) != 2 || v[1] != "7" {
		t.Fatalf("CONFIG GET timeout = %v, %v; WithArgs not applied", v, err)
	}
	if _, err := admin.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr

	s.Kill(t)
	if _, err := admin.Do("PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart(t)
	if s.Addr != addr {
		t.Errorf("Restart moved the server from %s to %s", addr, s.Addr)
	}
	if v, err := redis.String(s.Admin(t).Do("GET", "k")); err != nil || v != "v" {
		t.Errorf("after Kill+Restart GET k = %q, %v; want v", v, err)
	}

	s.Stop(t)
	s.Stop(t) // idempotent
	s.Restart(t)
	if v, err := redis.String(s.Admin(t).Do("GET", "k")); err != nil || v != "v" {
		t.Errorf("after Stop+Restart GET k = %q, %v; want v", v, err)
	}
}

func TestMiniRefusesAtHook(t *testing.T) {
	rec := &recordingTB{TB: t}
	s := redistest.Mini(rec)
	if s.Kind != redistest.KindMiniredis || s.Mini == nil || s.Addr != s.Mini.Addr() {
		t.Fatalf("Mini = %+v", s)
	}
	raw, err := redis.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Do("SET", "k", "v", "EX", 1); err == nil || !strings.Contains(err.Error(), "redis24") {
		t.Fatalf("SET k v EX 1 = %v, want the hook's error", err)
	}
	if s.Mini.Exists("k") {
		t.Error("the hook let SET k v EX 1 through")
	}
	if errs := rec.errors(); len(errs) != 1 || !strings.Contains(errs[0], "SET with EX option") {
		t.Errorf("reported %q, want one SET EX violation", errs)
	}
	if len(s.Census.Violations()) != 1 {
		t.Errorf("census violations = %v", s.Census.Violations())
	}

	// Admin connections are exempt; pooled ones work for 2.4 forms.
	if _, err := s.Admin(t).Do("SET", "k", "v", "EX", 100); err != nil {
		t.Errorf("SET EX via Admin = %v", err)
	}
	if _, err := raw.Do("PING"); err != nil {
		t.Errorf("PING on the plain connection = %v", err)
	}
	conn := s.Pool(t).Get()
	defer conn.Close()
	if v, err := redis.String(conn.Do("GET", "k")); err != nil || v != "v" {
		t.Errorf("GET k through Pool = %q, %v", v, err)
	}
}

func TestExternalServerAndCleanup(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	backing := redistest.Start(t)
	t.Setenv(redistest.EnvAddr, backing.Addr)
	t.Setenv(redistest.EnvPassword, "")

	s := redistest.Start(t)
	if s.Kind != redistest.KindExternal || s.Addr != backing.Addr {
		t.Fatalf("Start with %s = %q at %s, want external at %s", redistest.EnvAddr, s.Kind, s.Addr, backing.Addr)
	}
	ns, other := redistest.Namespace(t), redistest.Namespace(t)
	conn := s.Pool(t).Get()
	defer conn.Close()
	for _, k := range []string{ns + ":a", ns + ":b", "{" + ns + "}:c", "{" + ns + ":1}:d", other + ":a"} {
		if _, err := conn.Do("SET", k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	s.Cleanup(t, ns)
	keys, err := redis.Strings(backing.Admin(t).Do("KEYS", "*"))
	if err != nil || len(keys) != 1 || keys[0] != other+":a" {
		t.Errorf("after Cleanup keys = %v, %v; want only %s:a", keys, err, other)
	}
	redistest.RequireNoViolations(t, s)

	// A test that stops or cuts its server gets one of its own even here.
	for name, opt := range map[string]redistest.Option{
		"Private": redistest.Private(), "WithArgs": redistest.WithArgs("--timeout", "0"), "WithAppendOnly": redistest.WithAppendOnly(),
	} {
		p := redistest.Start(t, opt)
		if p.Kind != redistest.KindReal || p.Addr == backing.Addr {
			t.Errorf("Start(%s) with %s set = %q at %s, want a server of its own", name, redistest.EnvAddr, p.Kind, p.Addr)
		}
		p.Stop(t)
	}
}

func TestACLRules(t *testing.T) {
	rules := redistest.ACLRules()
	if rules[0] != "-@all" {
		t.Fatalf("first rule = %q", rules[0])
	}
	joined := " " + strings.Join(rules, " ") + " "
	for _, want := range []string{" +get ", " +brpoplpush ", " +config|get ", " +client|kill ", " +slowlog|len "} {
		if !strings.Contains(joined, want) {
			t.Errorf("rules lack %q", want)
		}
	}
	for _, bad := range []string{" +config ", " +eval ", " +client ", " +scan "} {
		if strings.Contains(joined, bad) {
			t.Errorf("rules contain %q", bad)
		}
	}
}

// TestMissingBinaryFails runs Start in a child process with no redis-server
// available and checks that it fails with install advice instead of skipping.
func TestMissingBinaryFails(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "1" {
		redistest.Start(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMissingBinaryFails$", "-test.v")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", redistest.EnvAddr+"=", redistest.EnvBinary+"=", "PATH=/nonexistent")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).ExitStatus() == 0 {
		t.Fatalf("child did not fail: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "apt-get install -y redis-server") || strings.Contains(string(out), "SKIP") {
		t.Errorf("child output lacks install advice or skipped:\n%s", out)
	}
}

// fatalTB records Fatalf and ends the goroutine, like testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...interface{}) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStartFailureShowsServerLog(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		redistest.Start(ft, redistest.WithArgs("--no-such-option", "1"))
		t.Error("Start with a bad option returned")
	}()
	<-done
	if !strings.Contains(ft.msg, "server log") || !strings.Contains(ft.msg, "no-such-option") {
		t.Errorf("failure message lacks the server log:\n%s", ft.msg)
	}
}

// On the shared server of ENGINE_TEST_REDIS, a command that acts on the
// whole server (flushes it, changes its configuration or role, cuts its
// clients, stops it) is refused on Admin and Pool connections and fails
// the test, naming Private: such a test needs a server of its own.
func TestExternalRefusesServerWideCommands(t *testing.T) {
	t.Setenv(redistest.EnvAddr, "")
	backing := redistest.Start(t)
	if _, err := backing.Admin(t).Do("SET", "someone-elses-key", "keep"); err != nil {
		t.Fatal(err)
	}
	t.Setenv(redistest.EnvAddr, backing.Addr)
	t.Setenv(redistest.EnvPassword, "")
	rec := &recordingTB{TB: t}
	s := redistest.Start(rec)
	admin, pooled := s.Admin(rec), s.Pool(rec).Get()
	defer pooled.Close()
	refused := [][]interface{}{
		{"FLUSHALL"}, {"flushdb"}, {"CONFIG", "SET", "timeout", "1"}, {"CONFIG", "RESETSTAT"},
		{"CLIENT", "KILL", "TYPE", "normal"}, {"client", "pause", 1000}, {"SLAVEOF", "NO", "ONE"},
		{"REPLICAOF", "NO", "ONE"}, {"DEBUG", "SLEEP", 0}, {"SHUTDOWN", "NOSAVE"},
	}
	for _, c := range []redis.Conn{admin, pooled} {
		for _, args := range refused {
			if _, err := c.Do(args[0].(string), args[1:]...); err == nil || !strings.Contains(err.Error(), "Private") {
				t.Errorf("%v on the shared server = %v, want it refused naming Private", args, err)
			}
		}
	}
	if errs := rec.errors(); len(errs) != 2*len(refused) || !strings.Contains(errs[0], "redistest.Private") {
		t.Errorf("reported %d errors (%q), want %d naming redistest.Private", len(errs), errs, 2*len(refused))
	}
	// Reads and the test's own keys are fine.
	if _, err := admin.Do("CONFIG", "GET", "timeout"); err != nil {
		t.Errorf("CONFIG GET on the shared server: %v", err)
	}
	if v, err := redis.String(admin.Do("GET", "someone-elses-key")); err != nil || v != "keep" {
		t.Errorf("someone else's key = %q, %v; want it kept", v, err)
	}
}
