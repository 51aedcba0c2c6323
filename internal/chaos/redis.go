package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// redisServer is a redis-server child process that the harness starts,
// stops and restarts on one port and directory. Its default user may run
// only the Redis 2.4 command table (the rules of redistest); an "admin"
// user with every command is for the harness's setup, inspection and
// fault injection.
type redisServer struct {
	Addr    string
	bin     string
	dir     string
	port    int
	args    []string
	adminPW string
	logPath string
	v24     bool // a Redis 2.4: a config file, no ACL, no admin user

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

type redisOptions struct {
	appendOnly bool
	timeout    int // server "timeout": idle connections closed after this many seconds
	// bin24, when set, is a Redis 2.4 redis-server to start instead of
	// the one findRedisServer finds.
	bin24 string
}

// findRedisServer finds redis-server: $REDIS_SERVER or PATH.
func findRedisServer() (string, error) {
	if bin := os.Getenv(redistest.EnvBinary); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s=%s: %w", redistest.EnvBinary, bin, err)
		}
		return bin, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("chaos: redis-server not found in PATH (install it, e.g. apt-get install redis-server, or set %s): %w", redistest.EnvBinary, err)
	}
	return bin, nil
}

func startRedis(bin, dir string, o redisOptions) (*redisServer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	s := &redisServer{bin: bin, dir: dir, adminPW: hex.EncodeToString(pw), logPath: filepath.Join(dir, "redis.log")}
	if o.bin24 != "" {
		// 2.4 reads a config file only, and has no ACL: the processes'
		// connections are held to the 2.4 table by their own guard.
		s.bin, s.v24 = o.bin24, true
		s.args = []string{"bind 127.0.0.1", "dir " + dir, "logfile " + s.logPath, "daemonize no",
			"timeout " + strconv.Itoa(o.timeout), "appendonly no"}
		if o.appendOnly {
			s.args = append(s.args, "appendonly yes", "appendfsync always")
		}
		if err := s.startOnFreePort(); err != nil {
			return nil, err
		}
		return s, nil
	}
	args := []string{"--bind", "127.0.0.1", "--save", "", "--dir", dir, "--logfile", s.logPath}
	if o.appendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, "--timeout", strconv.Itoa(o.timeout))
	args = append(args, "--user", "default", "on", "nopass", "~*", "&*")
	args = append(args, redistest.ACLRules()...)
	if o.appendOnly {
		args = append(args, redistest.AOFReplayRule)
	}
	args = append(args, "--user", "admin", "on", ">"+s.adminPW, "~*", "&*", "+@all")
	s.args = args
	if err := s.startOnFreePort(); err != nil {
		return nil, err
	}
	return s, nil
}

// The harness's servers listen on ports below the kernel's ephemeral
// range (ip_local_port_range: 32768 and up by default). A server's port
// is free while a restart has it down, and a port from that range, where
// every outgoing connection and every server started on port 0 (another
// test's, or another scenario's) takes its own, could be taken meanwhile:
// the restarted server would then fail to bind, and the harness's
// processes would talk to whatever took the port. Below the range only
// servers that choose their port do; portsHeld keeps this process's
// from choosing one twice, for the process's life.
const (
	portLow  = 20000
	portHigh = 32000
)

var (
	portsMu   sync.Mutex
	portsHeld = map[int]bool{}
)

// holdPort reserves port for this process's servers; false if held.
func holdPort(port int) bool {
	portsMu.Lock()
	defer portsMu.Unlock()
	if portsHeld[port] {
		return false
	}
	portsHeld[port] = true
	return true
}

func releasePort(port int) {
	portsMu.Lock()
	defer portsMu.Unlock()
	delete(portsHeld, port)
}

// startOnFreePort starts the server on a free loopback port below the
// ephemeral range, trying another when the chosen one was taken.
func (s *redisServer) startOnFreePort() error {
	last := errors.New("no free port")
	for try := 0; try < 20; try++ {
		var b [2]byte
		_, _ = rand.Read(b[:])
		port := portLow + (int(b[0])<<8|int(b[1]))%(portHigh-portLow)
		if !holdPort(port) {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			releasePort(port)
			last = err
			continue
		}
		l.Close()
		s.port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if last = s.Start(); last == nil {
			return nil
		}
		releasePort(port)
	}
	return last
}

// Start starts the server (again) on its port and waits for PING.
func (s *redisServer) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("redis-server already running")
	}
	args := append([]string{"--port", strconv.Itoa(s.port)}, s.args...)
	if s.v24 {
		conf := filepath.Join(s.dir, "redis.conf")
		text := "port " + strconv.Itoa(s.port) + "\n" + strings.Join(s.args, "\n") + "\n"
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return err
		}
		args = []string{conf}
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited at start; log %s:\n%s", s.logPath, tail(s.logPath, 20))
		default:
		}
		c, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(time.Second), redis.DialReadTimeout(time.Second))
		if err == nil {
			_, err = c.Do("PING")
			if err == nil {
				err = s.ours(c, cmd.Process.Pid)
			}
			c.Close()
			if err == nil {
				break
			}
			if errors.Is(err, errNotOurs) {
				_ = cmd.Process.Kill()
				<-done
				return err
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server on %s did not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd, s.done = cmd, done
	return nil
}

// errNotOurs: the port answered, but not from the server just started.
var errNotOurs = errors.New("another process answers on the server's port")

// ours checks, when INFO says (process_id), that the server answering
// on c is the process pid: never a stranger that took the port.
func (s *redisServer) ours(c redis.Conn, pid int) error {
	info, err := redis.String(c.Do("INFO"))
	if err != nil {
		return nil // INFO not allowed to this user: PING is all there is
	}
	if got, ok := redisinfo.Int(info, "process_id"); ok && got != int64(pid) {
		return fmt.Errorf("%w: %s answers as process %d, not %d", errNotOurs, s.Addr, got, pid)
	}
	return nil
}

// Stop stops the server with sig (SIGTERM: a graceful shutdown, which
// may take a while with a large AOF; SIGKILL: a crash) and waits for it.
func (s *redisServer) Stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// ReplayRefusals counts the commands the server refused while it replayed
// its append-only file at a start (Redis 7 logs each refusal, and runs the
// rest of the file): a server restarted with such refusals holds a state
// no client wrote, and a run on it proves nothing about the engine.
func (s *redisServer) ReplayRefusals() int {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "AOF-loading-client")
}

// replayFailures is a run's failure per lane whose server refused commands
// of its append-only file at a restart (ReplayRefusals).
func replayFailures(srvs []*redisServer) []string {
	var out []string
	for k, srv := range srvs {
		if n := srv.ReplayRefusals(); n > 0 {
			out = append(out, fmt.Sprintf("lane %d's server refused %d commands replaying its append-only file at a restart (see %s)", k, n, srv.logPath))
		}
	}
	return out
}

// Admin dials a connection as the admin user, with every command.
func (s *redisServer) Admin() (redis.Conn, error) {
	c, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(2*time.Second),
		redis.DialReadTimeout(30*time.Second), redis.DialWriteTimeout(10*time.Second))
	if err != nil {
		return nil, err
	}
	if s.v24 {
		return c, nil
	}
	if _, err := c.Do("AUTH", "admin", s.adminPW); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// AdminPool is a pool of admin connections.
func (s *redisServer) AdminPool() *redis.Pool {
	return &redis.Pool{MaxIdle: 4, IdleTimeout: 500 * time.Millisecond, Dial: s.Admin,
		TestOnBorrow: func(c redis.Conn, _ time.Time) error { _, err := c.Do("PING"); return err }}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	end := len(b)
	cnt := 0
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' && i != len(b)-1 {
			cnt++
			if cnt == n {
				return string(b[i+1 : end])
			}
		}
	}
	return string(b)
}
