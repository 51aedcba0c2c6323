package engine_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// NewPool takes "host:port" or a redis:// URL (password, database) and
// reaches the server; a password-protected server refuses a wrong one.
func TestNewPool(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := "newpool-" + redistest.Namespace(t)
	for _, addr := range []string{srv.Addr, "redis://" + srv.Addr + "/3"} {
		pool, err := engine.NewPool(withPassword(srv, addr), engine.Config{})
		if err != nil {
			t.Fatalf("NewPool(%s): %v", addr, err)
		}
		conn, err := pool.GetContext(ctx)
		if err != nil {
			t.Fatalf("NewPool(%s): a connection: %v", addr, err)
		}
		if _, err := redis.DoContext(conn, ctx, "SET", key, "v"); err != nil {
			t.Errorf("NewPool(%s): SET: %v", addr, err)
		}
		conn.Close()
		pool.Close()
	}
	// The URL's database was selected: the key is in db 3 only.
	admin := srv.Admin(t)
	if _, err := admin.Do("SELECT", 3); err != nil {
		t.Fatal(err)
	}
	if n, err := redis.Int(admin.Do("EXISTS", key)); err != nil || n != 1 {
		t.Errorf("key in db 3: %d, %v; want the URL's database used", n, err)
	}
	admin.Do("DEL", key)
	admin.Do("SELECT", 0)
	admin.Do("DEL", key)
}

// withPassword puts the password of an external test server, if it has
// one, in addr.
func withPassword(_ *redistest.Server, addr string) string {
	pw := os.Getenv(redistest.EnvPassword)
	if pw == "" {
		return addr
	}
	return "redis://:" + pw + "@" + strings.TrimPrefix(addr, "redis://")
}

// A mistaken address is refused when the pool is made, saying what is
// wrong and never repeating the password.
func TestNewPoolRefusesBadAddresses(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"":                                  "empty",
		"http://localhost:6379":             `scheme "http"`,
		"redis://:s3cret@localhost:6379/x":  `path "/x"`,
		"redis://:s3cret@localhost/0?tls=1": "no query",
		"redis://:s3cret@/0":                "no host",
		"redis://:s3cret@local host:6379":   "does not parse",
	} {
		_, err := engine.NewPool(addr, engine.Config{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewPool(%q) = %v; want an error saying %q", addr, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("NewPool(%q) error repeats the password: %v", addr, err)
		}
	}
}
