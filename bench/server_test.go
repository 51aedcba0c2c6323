package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// snapshotsOff checks that the server at addr runs version prefix (when
// not "") with no snapshot configured.
func snapshotsOff(t *testing.T, addr, prefix string) {
	t.Helper()
	c, err := redis.Dial("tcp", addr, redis.DialConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := NewAdmin(addr)
	defer a.Close()
	info, err := a.Info("server")
	if err != nil {
		t.Fatal(err)
	}
	if v := info["redis_version"]; !strings.HasPrefix(v, prefix) {
		t.Fatalf("redis_version %q, want %s*", v, prefix)
	}
	save, err := redis.Strings(c.Do("CONFIG", "GET", "save"))
	if err != nil {
		t.Fatal(err)
	}
	if len(save) != 2 || save[1] != "" {
		t.Errorf("CONFIG GET save = %q, want snapshots off", save)
	}
}

// TestStartRedisNoSnapshots: the server the tests share, started by
// StartRedis, saves no snapshot.
func TestStartRedisNoSnapshots(t *testing.T) {
	snapshotsOff(t, testRedis.Addr, "")
}

// TestStartRedis24: StartRedis starts a real Redis 2.4 (its configuration
// is a file every version reads) with snapshots off, and Stop removes its
// directory.
func TestStartRedis24(t *testing.T) {
	bin := os.Getenv(redis24Env)
	if bin == "" {
		t.Skipf("%s is not set: StartRedis was not tried on a real Redis 2.4 (set it to the path of a Redis 2.4 redis-server)", redis24Env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := StartRedis(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	snapshotsOff(t, srv.Addr, "2.4.")
	dir := srv.dir
	srv.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the server's directory %s is still there (%v)", dir, err)
	}
}
