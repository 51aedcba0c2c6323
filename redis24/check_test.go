package redis24_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

type cmd struct {
	name string
	args []interface{}
}

func c(name string, args ...interface{}) cmd { return cmd{name, args} }

func (c cmd) String() string {
	parts := []string{c.name}
	for _, a := range c.args {
		if b, ok := a.([]byte); ok {
			a = string(b)
		}
		parts = append(parts, fmt.Sprint(a))
	}
	return strings.Join(parts, " ")
}

// The post-2.4 forms an engine might be tempted to send.
var refused = []cmd{
	c("SET", "k", "v", "EX", 10), c("SET", "k", "v", "PX", 100), c("set", "k", "v", "nx"),
	c("SET", "k", "v", "XX"), c("SET", "k", "v", "KEEPTTL"), c("SET", "k", "v", "GET"),
	c("SET", "k"), c("SET", "k", "v", "EX", 10, "NX"),
	c("HSET", "h", "a", 1, "b", 2), c("EXISTS", "k1", "k2"), c("LPOP", "k", 2), c("RPOP", "k", 2),
	c("ZADD", "z", "NX", 1, "a"), c("ZADD", "z", "XX", 1, "a"), c("ZADD", "z", "CH", 1, "a"),
	c("ZADD", "z", "INCR", 1, "a"), c("ZADD", "z", "GT", 1, "a"), c("ZADD", "z", "lt", 1, "a"),
	c("ZADD", "z", 1, "a", 2), c("ZADD", "z", "one", "a"), c("ZADD", "z", "nan", "a"),
	c("ZADD", "z", "1_0", "a"), c("ZADD", "z", "1e400", "a"),
	c("ZRANGE", "z", 0, 10, "BYSCORE"), c("ZRANGE", "z", 0, -1, "REV"), c("ZRANGE", "z", "(1", 5, "BYSCORE"),
	c("ZRANGE", "z", 0, 10, "BYSCORE", "LIMIT", 0, 1), c("ZRANGE", "z", 0, -1, "WITHSCORES", "REV"),
	c("ZRANGE", "z", "a", "b"), c("ZRANGE", "z", 0, -1, "foo"),
	c("BLPOP", "q", 0.5), c("BLPOP", "a", "b", "1.0"), c("BRPOP", "q", "0.5"), c("BRPOP", "q", "1e3"),
	c("BRPOPLPUSH", "a", "b", 0.5), c("BRPOPLPUSH", "a", "b", "1.0"), c("BLPOP", "q", -1), c("BLPOP", "q"),
	c("PING", "msg"), c("INFO", "server"), c("INFO", "all"), c("CONFIG", "GET", "a", "b"),
	c("CONFIG", "REWRITE"), c("CONFIG", "HELP"), c("CONFIG", "GET"), c("CONFIG", "SET", "a"),
	c("AUTH", "user", "pass"), c("SRANDMEMBER", "k", 2), c("SPOP", "k", 2),
	c("EXPIRE", "k", 10, "NX"), c("EXPIRE", "k", 10, "GT"), c("EXPIREAT", "k", 10, "XX"),
	c("EXPIRE", "k", 1.5), c("SETEX", "k", 0, "v"), c("SETEX", "k", "1.5", "v"),
	c("ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", 0), c("ZRANGEBYSCORE", "z", "a", "+inf"),
	c("ZRANGEBYSCORE", "z", 0, 1, "BYLEX"), c("ZRANGEBYSCORE", "z", 0, 1, "LIMIT", "x", 10),
	c("ZREVRANGEBYSCORE", "z", "+inf", "-inf", "LIMIT", 0, 1.5),
	c("CLIENT", "SETNAME", "x"), c("CLIENT", "GETNAME"), c("CLIENT", "ID"), c("CLIENT", "KILL", "ID", 5),
	c("CLIENT", "NO-EVICT", "on"), c("SHUTDOWN", "NOSAVE"), c("SHUTDOWN", "SAVE"),
	c("OBJECT", "FREQ", "k"), c("OBJECT", "HELP"), c("SLOWLOG", "HELP"),
	c("FLUSHDB", "ASYNC"), c("FLUSHALL", "ASYNC"), c("BGSAVE", "SCHEDULE"),
	c("LPUSHX", "k", "a", "b"), c("HMSET", "h", "a"), c("MSET", "a"),
	c("LRANGE", "k", 0, "x"), c("LRANGE", "k", "1.5", -1), c("LTRIM", "k", 0, "end"),
	c("LREM", "k", "all", "v"), c("LINDEX", "k", "first"), c("LSET", "k", "x", "v"),
	c("LINSERT", "k", "MIDDLE", "a", "b"), c("INCRBY", "k", 1.5), c("HINCRBY", "h", "f", "1.5"),
	c("SETBIT", "k", 1, 2), c("GETBIT", "k", -1), c("SELECT", "db0"),
	c("ZUNIONSTORE", "d", 0, "a"), c("ZUNIONSTORE", "d", 3, "a", "b"),
	c("ZINTERSTORE", "d", 2, "a", "b", "WEIGHTS", 1), c("ZINTERSTORE", "d", 1, "a", "AGGREGATE", "AVG"),
	c("SORT", "k", "LIMIT", 0), c("SORT", "k", "BYSCORE"),
	c("EVAL", "return 1", 0), c("EVALSHA", "abc", 0), c("SCRIPT", "LOAD", "return 1"),
	c("TIME"), c("PEXPIRE", "k", 100), c("PEXPIREAT", "k", 100), c("PSETEX", "k", 100, "v"),
	c("PTTL", "k"), c("UNLINK", "k"), c("SCAN", 0), c("SSCAN", "s", 0), c("HSCAN", "h", 0),
	c("ZSCAN", "z", 0), c("LMOVE", "a", "b", "LEFT", "RIGHT"), c("BLMOVE", "a", "b", "LEFT", "RIGHT", 1),
	c("ZPOPMIN", "z"), c("BZPOPMIN", "z", 1), c("HELLO", 3), c("XADD", "s", "*", "f", "v"),
	c("INCRBYFLOAT", "k", 1.5), c("HINCRBYFLOAT", "h", "f", 1.5), c("BITCOUNT", "k"), c("BITOP", "AND", "d", "a"),
	c("GETDEL", "k"), c("GETEX", "k"), c("DUMP", "k"), c("RESTORE", "k", 0, "x"), c("TOUCH", "k"),
	c("COMMAND"), c("WAIT", 0, 0), c("ACL", "WHOAMI"), c("RESET"), c("COPY", "a", "b"),
	c("FOO"), c("CONFIG GET", "maxmemory"),
}

// The 2.4 forms an engine would use.
var accepted = []cmd{
	c("SET", "k", "v"), c("SETEX", "k", 10, "v"), c("SETNX", "k", "v"), c("GET", "k"),
	c("MGET", "a", "b"), c("DEL", "k1", "k2"), c("EXISTS", "k"), c("EXPIRE", "k", 10),
	c("EXPIRE", "k", -1), c("EXPIREAT", "k", int64(1700000000)), c("TTL", "k"), c("PERSIST", "k"),
	c("HSET", "h", "f", "v"), c("HSETNX", "h", "f", "v"), c("HMSET", "h", "a", 1, "b", 2),
	c("HGETALL", "h"), c("HMGET", "h", "a", "b"), c("HDEL", "h", "a", "b", "c"), c("HGET", "h", "f"),
	c("HLEN", "h"), c("HEXISTS", "h", "f"), c("LPUSH", "l", "a", "b"), c("RPUSH", "l", "a", "b", "c"),
	c("LRANGE", "l", 0, -1), c("LTRIM", "l", 0, 99), c("LREM", "l", 0, "v"), c("LLEN", "l"),
	c("LINDEX", "l", -1), c("LSET", "l", 0, "v"), c("LINSERT", "l", "before", "a", "b"),
	c("RPOPLPUSH", "a", "b"), c("BRPOPLPUSH", "a", "b", 5), c("BLPOP", "a", "b", 5),
	c("BRPOP", "a", 0), c("LPOP", "l"), c("RPOP", "l"),
	c("ZADD", "z", 1, "a", 2, "b"), c("ZADD", "z", 0.5, "a"), c("ZADD", "z", "-inf", "a", "+inf", "b"),
	c("ZADD", "z", "1e3", "a"), c("ZREM", "z", "a", "b"), c("ZINCRBY", "z", 1.5, "a"),
	c("ZRANGEBYSCORE", "z", "-inf", "(5", "LIMIT", 0, 10, "WITHSCORES"),
	c("ZRANGEBYSCORE", "z", "(1", "+inf"), c("ZREVRANGEBYSCORE", "z", "+inf", "-inf", "WITHSCORES", "LIMIT", 0, 1),
	c("ZRANGE", "z", 0, -1, "WITHSCORES"), c("ZRANGE", "z", 0, -1), c("ZREVRANGE", "z", 0, 10, "withscores"),
	c("ZSCORE", "z", "a"), c("ZCARD", "z"), c("ZCOUNT", "z", "-inf", "(3"), c("ZRANK", "z", "a"),
	c("ZREMRANGEBYSCORE", "z", "-inf", 1700000000), c("ZREMRANGEBYRANK", "z", 0, -11),
	c("ZUNIONSTORE", "d", 2, "a", "b"), c("ZINTERSTORE", "d", 2, "a", "b", "WEIGHTS", 1, 2.5, "AGGREGATE", "MAX"),
	c("SADD", "s", "a", "b"), c("SREM", "s", "a", "b"), c("SMEMBERS", "s"), c("SISMEMBER", "s", "a"),
	c("SCARD", "s"), c("SPOP", "s"), c("SRANDMEMBER", "s"), c("SMOVE", "a", "b", "m"),
	c("INCR", "n"), c("INCRBY", "n", 5), c("DECRBY", "n", -5), c("HINCRBY", "h", "f", 1),
	c("WATCH", "a", "b"), c("UNWATCH"), c("MULTI"), c("EXEC"), c("DISCARD"), c("PING"), c("INFO"),
	c("TYPE", "k"), c("RENAME", "a", "b"), c("RENAMENX", "a", "b"), c("AUTH", "pw"), c("SELECT", 0),
	c("FLUSHDB"), c("FLUSHALL"), c("KEYS", "ns:*"), c("DBSIZE"), c("ECHO", "hi"),
	c("CONFIG", "GET", "maxmemory"), c("CONFIG", "SET", "timeout", 0), c("CONFIG", "RESETSTAT"),
	c("CLIENT", "LIST"), c("CLIENT", "KILL", "127.0.0.1:5000"), c("OBJECT", "ENCODING", "k"),
	c("SLOWLOG", "GET"), c("SLOWLOG", "GET", 10), c("SLOWLOG", "LEN"), c("SLOWLOG", "RESET"),
	c("SORT", "l", "BY", "w_*", "LIMIT", 0, 10, "GET", "#", "GET", "o_*", "DESC", "ALPHA", "STORE", "d"),
	c("PUBLISH", "ch", "m"), c("SUBSCRIBE", "a", "b"), c("UNSUBSCRIBE"), c("PSUBSCRIBE", "a*"),
	c("PUNSUBSCRIBE"), c("GETSET", "k", "v"), c("APPEND", "k", "v"), c("STRLEN", "k"),
	c("SETBIT", "k", 7, 1), c("GETBIT", "k", 7), c("SETRANGE", "k", 0, "x"), c("GETRANGE", "k", 0, -1),
	c("MSET", "a", 1, "b", 2), c("MSETNX", "a", 1), c("SHUTDOWN"), c("SAVE"), c("BGSAVE"),
	c("LASTSAVE"), c("RANDOMKEY"), c("MOVE", "k", 1), c("get", "k"), c("Set", "k", []byte("v")),
	c("HMSET", redis.Args{}.Add("h").AddFlat(map[string]int{"a": 1})...),
	c("SET", "k", true), c("SET", "k", nil), c("INCRBY", "n", int32(-3)), c("ZADD", "z", float32(1.25), "a"),
}

func TestCheckRefusesPost24Forms(t *testing.T) {
	for _, tc := range refused {
		err := redis24.Check(tc.name, tc.args...)
		if err == nil {
			t.Errorf("Check(%s) = nil, want a violation", tc)
			continue
		}
		if !errors.Is(err, redis24.ErrNot24) {
			t.Errorf("Check(%s): errors.Is(err, ErrNot24) is false for %v", tc, err)
		}
		var v *redis24.Violation
		if !errors.As(err, &v) || v.Reason == "" || v.Command != strings.ToUpper(tc.name) {
			t.Errorf("Check(%s) = %#v, want a *Violation with a reason", tc, err)
		}
	}
}

func TestCheckAccepts24Forms(t *testing.T) {
	for _, tc := range accepted {
		if err := redis24.Check(tc.name, tc.args...); err != nil {
			t.Errorf("Check(%s) = %v, want nil", tc, err)
		}
	}
	if err := redis24.Check(""); err != nil {
		t.Errorf(`Check("") = %v, want nil (redigo flush)`, err)
	}
}

func TestViolationMessage(t *testing.T) {
	err := redis24.Check("SET", "k", "v", "EX", 10)
	var v *redis24.Violation
	if !errors.As(err, &v) {
		t.Fatalf("Check = %v, want *Violation", err)
	}
	if v.Reason != "SET with EX option needs Redis 2.6.12" {
		t.Errorf("Reason = %q", v.Reason)
	}
	if !strings.HasPrefix(v.Caller, "redis24/check_test.go:") {
		t.Errorf("Caller = %q, want this file", v.Caller)
	}
	want := "redis24: SET with EX option needs Redis 2.6.12 (called from " + v.Caller + ")"
	if v.Error() != want {
		t.Errorf("Error() = %q, want %q", v.Error(), want)
	}
	if strings.Join(v.Args, " ") != "k v EX 10" {
		t.Errorf("Args = %q", v.Args)
	}
	for _, tc := range []struct {
		cmd    cmd
		reason string
	}{
		{c("HSET", "h", "a", 1, "b", 2), "HSET with several fields needs Redis 4.0 (use HMSET)"},
		{c("EVAL", "return 1", 0), "EVAL is not a Redis 2.4 command (needs Redis 2.6)"},
		{c("BLPOP", "q", 0.5), `BLPOP timeout "0.5" is not a non-negative integer number of seconds (float timeouts need Redis 6.0)`},
		{c("ZADD", "z", "nx", 1, "a"), "ZADD with NX option needs Redis 3.0.2"},
		{c("EXPIRE", "k", 1, "gt"), "EXPIRE with GT option needs Redis 7.0"},
	} {
		err := redis24.Check(tc.cmd.name, tc.cmd.args...)
		if !errors.As(err, &v) || v.Reason != tc.reason {
			t.Errorf("Check(%s) = %v, want reason %q", tc.cmd, err, tc.reason)
		}
	}
}

func TestAllowed(t *testing.T) {
	for _, name := range []string{"get", "GET", "BrPopLPush", "config", "replconf", "slowlog"} {
		if !redis24.Allowed(name) {
			t.Errorf("Allowed(%q) = false", name)
		}
	}
	for _, name := range []string{"", "eval", "hello", "scan", "config get", "getdel", "psync"} {
		if redis24.Allowed(name) {
			t.Errorf("Allowed(%q) = true", name)
		}
	}
}

// TestTableMatchesCommandsTxt checks the compiled table against commands.txt
// (the copy in this directory; nothing outside the module is read).
func TestTableMatchesCommandsTxt(t *testing.T) {
	f, err := os.Open("commands.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			want = append(want, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	got := redis24.Commands()
	if len(want) != 123 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("compiled table (%d names) differs from commands.txt (%d names): run go generate ./redis24/", len(got), len(want))
	}
	got[0] = "mutated"
	if redis24.Commands()[0] != "get" {
		t.Error("Commands returns the internal table, not a copy")
	}
}
