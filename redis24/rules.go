package redis24

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// arity is the arity column of the 2.4.18 command table (src/redis.c),
// counting the command name: n means exactly n, -n means at least n.
var arity = map[string]int{
	"get": 2, "set": 3, "setnx": 3, "setex": 4, "append": 3, "strlen": 2,
	"del": -2, "exists": 2, "setbit": 4, "getbit": 3, "setrange": 4,
	"getrange": 4, "substr": 4, "incr": 2, "decr": 2, "mget": -2,
	"rpush": -3, "lpush": -3, "rpushx": 3, "lpushx": 3, "linsert": 5,
	"rpop": 2, "lpop": 2, "brpop": -3, "brpoplpush": 4, "blpop": -3,
	"llen": 2, "lindex": 3, "lset": 4, "lrange": 4, "ltrim": 4, "lrem": 4,
	"rpoplpush": 3, "sadd": -3, "srem": -3, "smove": 4, "sismember": 3,
	"scard": 2, "spop": 2, "srandmember": 2, "sinter": -2, "sinterstore": -3,
	"sunion": -2, "sunionstore": -3, "sdiff": -2, "sdiffstore": -3,
	"smembers": 2, "zadd": -4, "zincrby": 4, "zrem": -3,
	"zremrangebyscore": 4, "zremrangebyrank": 4, "zunionstore": -4,
	"zinterstore": -4, "zrange": -4, "zrangebyscore": -4,
	"zrevrangebyscore": -4, "zcount": 4, "zrevrange": -4, "zcard": 2,
	"zscore": 3, "zrank": 3, "zrevrank": 3, "hset": 4, "hsetnx": 4,
	"hget": 3, "hmset": -4, "hmget": -3, "hincrby": 4, "hdel": -3, "hlen": 2,
	"hkeys": 2, "hvals": 2, "hgetall": 2, "hexists": 3, "incrby": 3,
	"decrby": 3, "getset": 3, "mset": -3, "msetnx": -3, "randomkey": 1,
	"select": 2, "move": 3, "rename": 3, "renamenx": 3, "expire": 3,
	"expireat": 3, "keys": 2, "dbsize": 1, "auth": 2, "ping": 1, "echo": 2,
	"save": 1, "bgsave": 1, "bgrewriteaof": 1, "shutdown": 1, "lastsave": 1,
	"type": 2, "multi": 1, "exec": 1, "discard": 1, "sync": 1, "replconf": -1,
	"flushdb": 1, "flushall": 1, "sort": -2, "info": -1, "monitor": 1,
	"ttl": 2, "persist": 2, "slaveof": 3, "debug": -2, "config": -2,
	"subscribe": -2, "unsubscribe": -1, "psubscribe": -2, "punsubscribe": -1,
	"publish": 3, "watch": -2, "unwatch": 1, "object": -2, "client": -2,
	"slowlog": -2,
}

// tooMany explains, for commands that later versions made variadic or gave
// options, what the extra arguments would need.
var tooMany = map[string]string{
	"hset":        "HSET with several fields needs Redis 4.0 (use HMSET)",
	"exists":      "EXISTS with several keys needs Redis 3.0.3",
	"lpop":        "LPOP with a count needs Redis 6.2",
	"rpop":        "RPOP with a count needs Redis 6.2",
	"srandmember": "SRANDMEMBER with a count needs Redis 2.6",
	"spop":        "SPOP with a count needs Redis 3.2",
	"ping":        "PING with a message needs Redis 2.8.14",
	"auth":        "AUTH with a username needs Redis 6.0",
	"shutdown":    "SHUTDOWN with NOSAVE/SAVE needs Redis 2.6",
	"flushdb":     "FLUSHDB with ASYNC/SYNC needs Redis 4.0",
	"flushall":    "FLUSHALL with ASYNC/SYNC needs Redis 4.0",
	"bgsave":      "BGSAVE with SCHEDULE needs Redis 3.2.2",
	"lpushx":      "LPUSHX with several values needs Redis 4.0",
	"rpushx":      "RPUSHX with several values needs Redis 4.0",
}

// optionAddedIn names the version that added trailing options to commands
// whose 2.4 form has a fixed arity.
var optionAddedIn = map[string]map[string]string{
	"set": {"EX": "2.6.12", "PX": "2.6.12", "NX": "2.6.12", "XX": "2.6.12",
		"KEEPTTL": "6.0", "GET": "6.2", "EXAT": "6.2", "PXAT": "6.2"},
	"expire":   {"NX": "7.0", "XX": "7.0", "GT": "7.0", "LT": "7.0"},
	"expireat": {"NX": "7.0", "XX": "7.0", "GT": "7.0", "LT": "7.0"},
}

// addedIn names the version that introduced well-known commands missing from
// the 2.4 table, for friendlier messages.
var addedIn = map[string]string{
	"eval": "2.6", "evalsha": "2.6", "script": "2.6", "time": "2.6",
	"pexpire": "2.6", "pexpireat": "2.6", "pttl": "2.6", "psetex": "2.6",
	"incrbyfloat": "2.6", "hincrbyfloat": "2.6", "bitcount": "2.6",
	"bitop": "2.6", "dump": "2.6", "restore": "2.6", "migrate": "2.6",
	"scan": "2.8", "sscan": "2.8", "hscan": "2.8", "zscan": "2.8",
	"psync": "2.8", "role": "2.8.12", "command": "2.8.13", "bitpos": "2.8.7",
	"pfadd": "2.8.9", "pfcount": "2.8.9", "pfmerge": "2.8.9",
	"zrangebylex": "2.8.9", "zlexcount": "2.8.9", "wait": "3.0",
	"hstrlen": "3.2", "touch": "3.2.1", "geoadd": "3.2", "unlink": "4.0",
	"swapdb": "4.0", "memory": "4.0", "zpopmin": "5.0", "zpopmax": "5.0",
	"bzpopmin": "5.0", "bzpopmax": "5.0", "xadd": "5.0", "xread": "5.0",
	"xrange": "5.0", "xlen": "5.0", "xgroup": "5.0", "xreadgroup": "5.0",
	"xack": "5.0", "hello": "6.0", "acl": "6.0", "lpos": "6.0.6",
	"lmove": "6.2", "blmove": "6.2", "getdel": "6.2", "getex": "6.2",
	"copy": "6.2", "reset": "6.2", "smismember": "6.2", "zrangestore": "6.2",
	"lmpop": "7.0", "blmpop": "7.0", "zmpop": "7.0", "function": "7.0",
	"fcall": "7.0", "expiretime": "7.0", "sintercard": "7.0",
}

func notInTable(name string) string {
	up := strings.ToUpper(name)
	if v, ok := addedIn[name]; ok {
		return fmt.Sprintf("%s is not a Redis 2.4 command (needs Redis %s)", up, v)
	}
	return fmt.Sprintf("%s is not a Redis 2.4 command", up)
}

// checkArity checks the argument count (args exclude the command name).
func checkArity(name string, args []string) string {
	nargs := len(args)
	if arityOK(name, nargs) {
		return ""
	}
	a := arity[name]
	argc := nargs + 1
	if a > 0 && argc > a {
		opt := strings.ToUpper(args[a-1])
		if v, ok := optionAddedIn[name][opt]; ok {
			return fmt.Sprintf("%s with %s option needs Redis %s", strings.ToUpper(name), opt, v)
		}
		if msg, ok := tooMany[name]; ok {
			return msg
		}
	}
	up := strings.ToUpper(name)
	if a > 0 {
		return fmt.Sprintf("%s takes exactly %d arguments at Redis 2.4, got %d", up, a-1, nargs)
	}
	return fmt.Sprintf("%s takes at least %d arguments at Redis 2.4, got %d", up, -a-1, nargs)
}

// arityOK reports whether name (lower case) takes nargs arguments: the
// table's arity counts the name too, and is negative for "at least".
func arityOK(name string, nargs int) bool {
	a, argc := arity[name], nargs+1
	return (a > 0 && argc == a) || (a < 0 && argc >= -a)
}

// intArg is the rule of a command whose only rule is that the arguments
// at positions at are integers; what names them in the refusal.
type intArg struct {
	what string
	at   []int
}

// intArgRules are those commands. Both the full check (rules) and check's
// fast path for Go integer arguments (intArgNames) are built from them.
var intArgRules = map[string]intArg{
	"expire": {"seconds", []int{1}}, "expireat": {"timestamp", []int{1}},
	"incrby": {"increment", []int{1}}, "decrby": {"decrement", []int{1}},
	"hincrby": {"increment", []int{2}}, "select": {"index", []int{0}},
	"move": {"db", []int{1}}, "lindex": {"index", []int{1}},
	"lset": {"index", []int{1}}, "lrem": {"count", []int{1}},
	"lrange": {"argument", []int{1, 2}}, "ltrim": {"argument", []int{1, 2}},
	"getrange": {"argument", []int{1, 2}}, "substr": {"argument", []int{1, 2}},
	"zremrangebyrank": {"argument", []int{1, 2}},
}

// withIntArgRules adds intArgRules' checks to m and returns it.
func withIntArgRules(m map[string]func(args []string) string) map[string]func(args []string) string {
	for n, r := range intArgRules {
		up := strings.ToUpper(n)
		m[n] = func(a []string) string {
			for _, i := range r.at {
				if v := integer(up, r.what, a[i]); v != "" {
					return v
				}
			}
			return ""
		}
	}
	return m
}

// rules holds the argument-form checks; arity has been checked already.
var rules = withIntArgRules(map[string]func(args []string) string{
	"setex":            func(a []string) string { return positive("SETEX", "seconds", a[1]) },
	"getbit":           func(a []string) string { return nonNegative("GETBIT", "offset", a[1]) },
	"setrange":         func(a []string) string { return nonNegative("SETRANGE", "offset", a[1]) },
	"setbit":           ruleSetbit,
	"linsert":          ruleLinsert,
	"mset":             func(a []string) string { return pairs("MSET", a) },
	"msetnx":           func(a []string) string { return pairs("MSETNX", a) },
	"hmset":            func(a []string) string { return pairs("HMSET", a[1:]) },
	"blpop":            func(a []string) string { return timeout("BLPOP", a[len(a)-1]) },
	"brpop":            func(a []string) string { return timeout("BRPOP", a[len(a)-1]) },
	"brpoplpush":       func(a []string) string { return timeout("BRPOPLPUSH", a[2]) },
	"zadd":             ruleZadd,
	"zincrby":          func(a []string) string { return score("ZINCRBY", "increment", a[1]) },
	"zrange":           func(a []string) string { return ruleZrange("ZRANGE", a) },
	"zrevrange":        func(a []string) string { return ruleZrange("ZREVRANGE", a) },
	"zrangebyscore":    func(a []string) string { return ruleZrangeByScore("ZRANGEBYSCORE", a) },
	"zrevrangebyscore": func(a []string) string { return ruleZrangeByScore("ZREVRANGEBYSCORE", a) },
	"zcount":           func(a []string) string { return scoreRange("ZCOUNT", a[1], a[2]) },
	"zremrangebyscore": func(a []string) string { return scoreRange("ZREMRANGEBYSCORE", a[1], a[2]) },
	"zunionstore":      func(a []string) string { return ruleZstore("ZUNIONSTORE", a) },
	"zinterstore":      func(a []string) string { return ruleZstore("ZINTERSTORE", a) },
	"sort":             ruleSort,
	"info":             ruleInfo,
	"config":           ruleConfig,
	"client":           ruleClient,
	"object":           ruleObject,
	"slowlog":          ruleSlowlog,
})

func isInt(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// isDouble mirrors 2.4's getDoubleFromObject: strtod over the whole string,
// no NaN, no overflow.
func isDouble(s string) bool {
	if strings.ContainsRune(s, '_') {
		return false
	}
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && !math.IsNaN(f)
}

func integer(cmd, what, s string) string {
	if isInt(s) {
		return ""
	}
	return fmt.Sprintf("%s %s %q is not an integer (Redis 2.4 would misread or refuse it)", cmd, what, s)
}

func integers(cmd string, ss []string) string {
	for _, s := range ss {
		if r := integer(cmd, "argument", s); r != "" {
			return r
		}
	}
	return ""
}

func nonNegative(cmd, what, s string) string {
	if n, err := strconv.ParseInt(s, 10, 64); err != nil || n < 0 {
		return fmt.Sprintf("%s %s %q is not a non-negative integer", cmd, what, s)
	}
	return ""
}

func positive(cmd, what, s string) string {
	if n, err := strconv.ParseInt(s, 10, 64); err != nil || n <= 0 {
		return fmt.Sprintf("%s %s %q is not a positive integer", cmd, what, s)
	}
	return ""
}

func timeout(cmd, s string) string {
	if n, err := strconv.ParseInt(s, 10, 64); err != nil || n < 0 {
		return fmt.Sprintf("%s timeout %q is not a non-negative integer number of seconds (float timeouts need Redis 6.0)", cmd, s)
	}
	return ""
}

func score(cmd, what, s string) string {
	if isDouble(s) {
		return ""
	}
	return fmt.Sprintf("%s %s %q is not a valid float", cmd, what, s)
}

// scoreRange checks ZRANGEBYSCORE-style bounds: a float, "(" + float, or ±inf.
func scoreRange(cmd string, bounds ...string) string {
	for _, b := range bounds {
		if !isDouble(strings.TrimPrefix(b, "(")) {
			return fmt.Sprintf("%s bound %q is not a float, (float, -inf or +inf", cmd, b)
		}
	}
	return ""
}

func pairs(cmd string, a []string) string {
	if len(a)%2 != 0 {
		return fmt.Sprintf("%s needs field/value pairs, got an odd number of arguments", cmd)
	}
	return ""
}

func isOneOf(s string, words ...string) bool {
	for _, w := range words {
		if strings.EqualFold(s, w) {
			return true
		}
	}
	return false
}

func ruleSetbit(a []string) string {
	if r := nonNegative("SETBIT", "offset", a[1]); r != "" {
		return r
	}
	if a[2] != "0" && a[2] != "1" {
		return fmt.Sprintf("SETBIT value %q is not 0 or 1", a[2])
	}
	return ""
}

func ruleLinsert(a []string) string {
	if !isOneOf(a[1], "BEFORE", "AFTER") {
		return fmt.Sprintf("LINSERT needs BEFORE or AFTER, got %q", a[1])
	}
	return ""
}

func ruleZadd(a []string) string {
	if isOneOf(a[1], "NX", "XX", "CH", "INCR") {
		return fmt.Sprintf("ZADD with %s option needs Redis 3.0.2", strings.ToUpper(a[1]))
	}
	if isOneOf(a[1], "GT", "LT") {
		return fmt.Sprintf("ZADD with %s option needs Redis 6.2", strings.ToUpper(a[1]))
	}
	rest := a[1:]
	if len(rest)%2 != 0 {
		return "ZADD needs score/member pairs, got an odd number of arguments"
	}
	for i := 0; i < len(rest); i += 2 {
		if r := score("ZADD", "score", rest[i]); r != "" {
			return r
		}
	}
	return ""
}

func ruleZrange(cmd string, a []string) string {
	if r := integers(cmd, a[1:3]); r != "" {
		return r
	}
	opts := a[3:]
	for _, o := range opts {
		if isOneOf(o, "BYSCORE", "BYLEX", "REV", "LIMIT") {
			return fmt.Sprintf("%s with %s option needs Redis 6.2", cmd, strings.ToUpper(o))
		}
	}
	if len(opts) == 0 || (len(opts) == 1 && isOneOf(opts[0], "WITHSCORES")) {
		return ""
	}
	return fmt.Sprintf("%s takes only key start stop [WITHSCORES] at Redis 2.4", cmd)
}

func ruleZrangeByScore(cmd string, a []string) string {
	if r := scoreRange(cmd, a[1], a[2]); r != "" {
		return r
	}
	for opts := a[3:]; len(opts) > 0; {
		switch {
		case isOneOf(opts[0], "WITHSCORES"):
			opts = opts[1:]
		case isOneOf(opts[0], "LIMIT") && len(opts) >= 3:
			if r := integers(cmd+" LIMIT", opts[1:3]); r != "" {
				return r
			}
			opts = opts[3:]
		default:
			return fmt.Sprintf("%s takes only WITHSCORES and LIMIT offset count at Redis 2.4, got %q", cmd, opts[0])
		}
	}
	return ""
}

func ruleZstore(cmd string, a []string) string {
	n, err := strconv.Atoi(a[1])
	if err != nil || n < 1 {
		return fmt.Sprintf("%s numkeys %q is not a positive integer", cmd, a[1])
	}
	if len(a) < 2+n {
		return fmt.Sprintf("%s numkeys is %d but only %d keys follow", cmd, n, len(a)-2)
	}
	for opts := a[2+n:]; len(opts) > 0; {
		switch {
		case isOneOf(opts[0], "WEIGHTS") && len(opts) > n:
			for _, w := range opts[1 : n+1] {
				if r := score(cmd, "weight", w); r != "" {
					return r
				}
			}
			opts = opts[n+1:]
		case isOneOf(opts[0], "AGGREGATE") && len(opts) >= 2 && isOneOf(opts[1], "SUM", "MIN", "MAX"):
			opts = opts[2:]
		default:
			return fmt.Sprintf("%s takes only WEIGHTS and AGGREGATE SUM|MIN|MAX at Redis 2.4, got %q", cmd, opts[0])
		}
	}
	return ""
}

func ruleSort(a []string) string {
	for opts := a[1:]; len(opts) > 0; {
		switch {
		case isOneOf(opts[0], "ASC", "DESC", "ALPHA"):
			opts = opts[1:]
		case isOneOf(opts[0], "BY", "GET", "STORE") && len(opts) >= 2:
			opts = opts[2:]
		case isOneOf(opts[0], "LIMIT") && len(opts) >= 3:
			if r := integers("SORT LIMIT", opts[1:3]); r != "" {
				return r
			}
			opts = opts[3:]
		default:
			return fmt.Sprintf("SORT option %q is not valid at Redis 2.4", opts[0])
		}
	}
	return ""
}

func ruleInfo(a []string) string {
	if len(a) > 0 {
		return "INFO with a section argument needs Redis 2.6"
	}
	return ""
}

// subcommand checks container commands: allowed maps a subcommand to its exact
// number of arguments after the subcommand.
func subcommand(cmd string, a []string, allowed map[string][]int, hint string) string {
	sub := strings.ToLower(a[0])
	counts, ok := allowed[sub]
	if !ok {
		return fmt.Sprintf("%s %s is not available at Redis 2.4 (only %s)", cmd, strings.ToUpper(sub), hint)
	}
	for _, c := range counts {
		if len(a)-1 == c {
			return ""
		}
	}
	return fmt.Sprintf("%s %s takes %v arguments at Redis 2.4, got %d", cmd, strings.ToUpper(sub), counts, len(a)-1)
}

func ruleConfig(a []string) string {
	if strings.EqualFold(a[0], "GET") && len(a) > 2 {
		return "CONFIG GET with several patterns needs Redis 7.0"
	}
	return subcommand("CONFIG", a, map[string][]int{"get": {1}, "set": {2}, "resetstat": {0}}, "GET, SET, RESETSTAT")
}

func ruleClient(a []string) string {
	if strings.EqualFold(a[0], "KILL") && len(a) == 2 && !strings.Contains(a[1], ":") {
		return "CLIENT KILL takes ip:port at Redis 2.4"
	}
	return subcommand("CLIENT", a, map[string][]int{"list": {0}, "kill": {1}}, "LIST, KILL ip:port")
}

func ruleObject(a []string) string {
	return subcommand("OBJECT", a, map[string][]int{"refcount": {1}, "encoding": {1}, "idletime": {1}}, "REFCOUNT, ENCODING, IDLETIME")
}

func ruleSlowlog(a []string) string {
	if r := subcommand("SLOWLOG", a, map[string][]int{"get": {0, 1}, "len": {0}, "reset": {0}}, "GET [n], LEN, RESET"); r != "" {
		return r
	}
	if strings.EqualFold(a[0], "GET") && len(a) == 2 {
		return integer("SLOWLOG GET", "count", a[1])
	}
	return ""
}
