package minihook_test

import (
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/internal/minihook"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

func TestMiniHook(t *testing.T) {
	m := miniredis.RunT(t)
	census := redis24.NewCensus()
	m.Server().SetPreHook(minihook.Hook(census.RecordViolation))
	raw, err := redis.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()

	_, err = raw.Do("SET", "k", "v", "EX", 1)
	if err == nil || !strings.Contains(err.Error(), "SET with EX option needs Redis 2.6.12") {
		t.Errorf("SET k v EX 1 through the hook = %v, want the redis24 error", err)
	}
	if m.Exists("k") {
		t.Error("the hook let SET k v EX 1 through")
	}
	if _, err := raw.Do("HELLO", 3); err == nil {
		t.Error("HELLO 3 passed the hook")
	}
	if _, err := raw.Do("SET", "k", "v"); err != nil {
		t.Errorf("SET k v = %v", err)
	}
	vs := census.Violations()
	if len(vs) != 2 || vs[0].Command != "SET" || vs[1].Command != "HELLO" {
		t.Errorf("violations = %v", vs)
	}
}
