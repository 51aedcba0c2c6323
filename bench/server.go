package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
)

// RedisServer is a redis-server child process started by the harness, on a
// free loopback port with persistence off.
type RedisServer struct {
	Addr string
	cmd  *exec.Cmd
	dir  string
	done chan error
}

// StartRedis starts bin (a redis-server binary, looked up in PATH when it
// has no slash) on a free 127.0.0.1 port and waits until it answers PING.
// The configuration goes through a file, the one way Redis 2.4 takes it,
// with lines every version accepts: appendonly no, daemonize no. Snapshots
// are switched off by CONFIG SET save "" once the server answers: 2.4
// refuses save "" in a file (a bad directive: it does not start), and a
// file without a save line leaves a later version at its default
// snapshots.
func StartRedis(ctx context.Context, bin string) (*RedisServer, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (%q): %w", bin, err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between probe and bind: retry
		s, err := startRedisOnce(ctx, path)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startRedisOnce(ctx context.Context, path string) (*RedisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bqbench-redis-")
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nappendonly no\ndaemonize no\ndir %s\nlogfile %s\n",
		port, dir, filepath.Join(dir, "redis.log"))
	confPath := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// What the server prints before it opens its logfile (2.4 reports a
	// bad configuration line so) goes to a file of its own.
	out, err := os.Create(filepath.Join(dir, "redis.out"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(path, confPath)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childProcAttr()
	err = cmd.Start()
	out.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &RedisServer{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, dir: dir, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(time.Second))
		if err == nil {
			_, err = c.Do("PING")
			if err == nil {
				_, err = c.Do("CONFIG", "SET", "save", "")
				c.Close()
				if err != nil {
					s.Stop()
					return nil, fmt.Errorf("redis-server on %s: switching snapshots off: %w", s.Addr, err)
				}
				return s, nil
			}
			c.Close()
		}
		select {
		case werr := <-s.done:
			early, _ := os.ReadFile(filepath.Join(dir, "redis.out"))
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			log = append(append(early, '\n'), log...)
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited (%v): %s", werr, lastLines(string(log), 5))
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s: %v", s.Addr, err)
		}
	}
}

// Stop terminates the server (SIGTERM, then SIGKILL after 5s) and removes
// its directory.
func (s *RedisServer) Stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	os.RemoveAll(s.dir)
	s.cmd = nil
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Admin is the harness's own connection pool to the server under test, for
// INFO, FLUSHALL and key cleanup. It never issues commands during a timed
// section except where a scenario says so.
type Admin struct {
	pool *redis.Pool
	// legacy: the server's INFO takes no section (before Redis 2.6):
	// every Info reads the whole of plain INFO, which has no sections and
	// no commandstats.
	legacy atomic.Bool
}

// Legacy reports whether the server turned out older than Redis 2.6
// (INFO without sections, no commandstats, no Lua).
func (a *Admin) Legacy() bool { return a.legacy.Load() }

// NewAdmin returns an Admin for addr.
func NewAdmin(addr string) *Admin {
	return &Admin{pool: &redis.Pool{
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", addr, redis.DialConnectTimeout(5*time.Second))
		},
		MaxIdle: 4,
	}}
}

// Close closes the pool.
func (a *Admin) Close() error { return a.pool.Close() }

// Do runs one command.
func (a *Admin) Do(cmd string, args ...any) (any, error) {
	c := a.pool.Get()
	defer c.Close()
	return c.Do(cmd, args...)
}

// Info returns the fields of INFO [section] as a map.
func (a *Admin) Info(section string) (map[string]string, error) {
	var args []any
	if section != "" && !a.legacy.Load() {
		args = append(args, section)
	}
	s, err := redis.String(a.Do("INFO", args...))
	var re redis.Error
	if len(args) > 0 && errors.As(err, &re) && strings.Contains(strings.ToLower(string(re)), "wrong number of arguments") {
		// Redis 2.4: INFO takes no argument. Plain INFO has every field.
		a.legacy.Store(true)
		s, err = redis.String(a.Do("INFO"))
	}
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// InfoInt returns one integer field of INFO section.
func (a *Admin) InfoInt(section, field string) (int64, error) {
	m, err := a.Info(section)
	if err != nil {
		return 0, err
	}
	v, ok := m[field]
	if !ok {
		return 0, fmt.Errorf("INFO %s has no field %s", section, field)
	}
	return strconv.ParseInt(v, 10, 64)
}

// CommandCalls returns calls per command from INFO commandstats
// ("cmdstat_zadd:calls=3,usec=..." → "zadd": 3).
func (a *Admin) CommandCalls() (map[string]int64, error) {
	m, err := a.Info("commandstats")
	if err != nil {
		return nil, err
	}
	if a.legacy.Load() {
		return nil, errNoCommandStats
	}
	out := map[string]int64{}
	for k, v := range m {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(f, "calls="); ok {
				c, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return nil, err
				}
				out[name] = c
			}
		}
	}
	return out, nil
}

// ServerCPU returns used_cpu_user + used_cpu_sys of the server, in seconds.
func (a *Admin) ServerCPU() (float64, error) {
	m, err := a.Info("cpu")
	if err != nil {
		return 0, err
	}
	u, err1 := strconv.ParseFloat(m["used_cpu_user"], 64)
	s, err2 := strconv.ParseFloat(m["used_cpu_sys"], 64)
	return u + s, errors.Join(err1, err2)
}

// errNoCommandStats: the server (older than 2.6) has no INFO commandstats.
var errNoCommandStats = errors.New("the server has no INFO commandstats (Redis < 2.6)")

// FlushAll empties the server (only ever called on the harness's own server).
func (a *Admin) FlushAll() error {
	_, err := a.Do("FLUSHALL")
	return err
}

// DeleteMatching deletes every key matching one of the glob patterns, with
// SCAN (or KEYS on servers older than 2.8). It returns how many it deleted.
func (a *Admin) DeleteMatching(patterns []string) (int, error) {
	c := a.pool.Get()
	defer c.Close()
	total := 0
	for _, p := range patterns {
		keys, err := scanKeys(c, p)
		if err != nil {
			return total, err
		}
		for i := 0; i < len(keys); i += 500 {
			j := min(i+500, len(keys))
			args := make([]any, 0, j-i)
			for _, k := range keys[i:j] {
				args = append(args, k)
			}
			n, err := redis.Int(c.Do("DEL", args...))
			if err != nil {
				return total, err
			}
			total += n
		}
	}
	return total, nil
}

func scanKeys(c redis.Conn, pattern string) ([]string, error) {
	var keys []string
	cursor := "0"
	for {
		r, err := redis.Values(c.Do("SCAN", cursor, "MATCH", pattern, "COUNT", 1000))
		if err != nil {
			if strings.Contains(strings.ToLower(err.Error()), "unknown command") {
				return redis.Strings(c.Do("KEYS", pattern))
			}
			return nil, err
		}
		cursor, _ = redis.String(r[0], nil)
		ks, err := redis.Strings(r[1], nil)
		if err != nil {
			return nil, err
		}
		keys = append(keys, ks...)
		if cursor == "0" {
			return keys, nil
		}
	}
}
