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
	args = append(args, "--user", "admin", "on", ">"+s.adminPW, "~*", "&*", "+@all")
	s.args = args
	if err := s.startOnFreePort(); err != nil {
		return nil, err
	}
	return s, nil
}

// startOnFreePort starts the server on a free loopback port, trying
// another when the chosen one was taken meanwhile.
func (s *redisServer) startOnFreePort() error {
	var last error
	for try := 0; try < 5; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if last = s.Start(); last == nil {
			return nil
		}
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
			c.Close()
			if err == nil {
				break
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
