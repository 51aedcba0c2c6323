package chaos

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// TestRestartKeepsTransactionTTL: a server of the restart scenarios,
// killed and started again, replays every command of its append-only file,
// the TTLs set inside transactions included. Redis 7.0 writes EXPIRE into
// the file as PEXPIREAT and replays a transaction's commands as the
// default user, which the 2.4 table alone does not allow: the restarted
// server then dropped each such EXPIRE, and ReplayRefusals counts that.
func TestRestartKeepsTransactionTTL(t *testing.T) {
	t.Parallel()
	bin, err := findRedisServer()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startRedis(bin, filepath.Join(t.TempDir(), "redis"), redisOptions{appendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(syscall.SIGKILL) })
	c, err := redis.Dial("tcp", srv.Addr, redis.DialReadTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.Send("MULTI")
	c.Send("SET", "k", "v")
	c.Send("EXPIRE", "k", 1000)
	if _, err := c.Do("EXEC"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	srv.Stop(syscall.SIGKILL)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	c, err = redis.Dial("tcp", srv.Addr, redis.DialReadTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ttl, err := redis.Int(c.Do("TTL", "k"))
	if err != nil || ttl <= 0 {
		t.Errorf("after a restart, TTL k = %d, %v; want the TTL set inside the transaction", ttl, err)
	}
	if n := srv.ReplayRefusals(); n != 0 {
		t.Errorf("the restarted server refused %d commands of its append-only file", n)
	}
}
