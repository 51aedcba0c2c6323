// Package redis24 checks that commands sent through redigo are valid for
// Redis 2.4.
//
// The command table of Redis 2.4.18 is compiled in (commands_gen.go, generated
// from commands.txt). [Check] validates one command with its arguments: the
// name must be in the table and the arguments must have a form that 2.4
// accepts and reads the same way as later versions do (no SET ... EX, no
// multi-field HSET, no float blocking timeouts, and so on). [Wrap] puts
// that check in front of every command sent on a redigo connection. (The
// module's tests put it in front of a miniredis server too; that hook is
// internal so that importers of this package do not build miniredis in.)
package redis24

//go:generate go run ./internal/gen -in commands.txt -out commands_gen.go

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// ErrNot24 is the sentinel matched by errors.Is for every [*Violation].
var ErrNot24 = errors.New("redis24: not valid for Redis 2.4")

// Violation describes a command, or a form of its arguments, that Redis 2.4
// would refuse or read differently from the version the caller tested with.
type Violation struct {
	// Command is the command name as given by the caller, upper-cased.
	Command string
	// Args are the arguments formatted the way redigo sends them.
	Args []string
	// Reason says what is wrong, e.g. "SET with EX option needs Redis 2.6.12".
	Reason string
	// Caller is the first frame outside redigo and redis24, as "dir/file.go:42",
	// or "" when unknown (for example in a miniredis hook).
	Caller string
}

// Error implements error.
func (v *Violation) Error() string {
	if v.Caller == "" {
		return "redis24: " + v.Reason
	}
	return "redis24: " + v.Reason + " (called from " + v.Caller + ")"
}

// Unwrap returns [ErrNot24], so that errors.Is(err, ErrNot24) holds.
func (v *Violation) Unwrap() error { return ErrNot24 }

// commandSet is the compiled table as a set, built once.
var commandSet = func() map[string]bool {
	m := make(map[string]bool, len(commandTable))
	for _, n := range commandTable {
		m[n] = true
	}
	return m
}()

// Allowed reports whether cmd (case-insensitive) is in the Redis 2.4 command
// table. It says nothing about the arguments; use [Check] for that.
func Allowed(cmd string) bool {
	return commandSet[strings.ToLower(cmd)]
}

// Commands returns the Redis 2.4.18 command table: lowercase names in the order
// of src/redis.c. The slice is a fresh copy.
func Commands() []string {
	out := make([]string, len(commandTable))
	copy(out, commandTable[:])
	return out
}

// Check returns nil if Redis 2.4 accepts cmd with args in this form, and a
// [*Violation] otherwise. Arguments may be of any type redigo accepts (string,
// []byte, integers, float64, bool, nil, redis.Argument); they are formatted the
// way redigo sends them. The empty command (redigo's flush) is accepted.
func Check(cmd string, args ...interface{}) error {
	if v := check(cmd, args); v != nil {
		v.Caller = callerOutside()
		return v
	}
	return nil
}

// check is Check without the caller lookup (which is only useful on the
// caller's own goroutine).
func check(cmd string, args []interface{}) *Violation {
	if cmd == "" {
		return nil
	}
	// Fast path, taken by nearly every command the engine sends: a name
	// of the table in lower or upper case, whose form is only its number
	// of arguments, needs neither a lower-cased copy of the name nor the
	// arguments formatted.
	if name, ok := plainName[cmd]; ok && arityOK(name, len(args)) {
		return nil
	}
	// A command whose only rule is that some arguments are integers
	// (LRANGE, LTRIM, HINCRBY ...) passes as well when those are Go
	// integers, which always format as one.
	if ia, ok := intArgNames[cmd]; ok && arityOK(ia.name, len(args)) && goInts(args, ia.rule.at) {
		return nil
	}
	// The few commands with other rules that hot paths send (a claim's
	// ZADD of lease deadlines, a result's SETEX, a batch's MSET) pass
	// when their Go-typed arguments show the rule holds.
	if tf, ok := typedFast[cmd]; ok && arityOK(tf.name, len(args)) && tf.rule(args) {
		return nil
	}
	return checkStrings(cmd, formatArgs(args))
}

// typedRules are commands with other rules whose arguments, as Go values,
// can show that the rule holds: true means the full check accepts them
// too; false only means that the full check decides.
var typedRules = map[string]func(args []interface{}) bool{
	"mset":   evenArgs,
	"msetnx": evenArgs,
	"setex": func(a []interface{}) bool {
		n, ok := goInt(a[1])
		return ok && n > 0
	},
	"zadd": func(a []interface{}) bool {
		if len(a)%2 != 1 {
			return false
		}
		for i := 1; i < len(a); i += 2 {
			if _, ok := goInt(a[i]); !ok {
				return false // an option word, a float or a string: the full check
			}
		}
		return true
	},
}

func evenArgs(a []interface{}) bool { return len(a)%2 == 0 }

// typedFast is typedRules by name, in lower and upper case.
var typedFast = byName(typedRules)

// goInt returns v as an int64 when it is a Go integer that formats as
// one Redis 2.4 reads (not a uint64 past MaxInt64).
func goInt(v interface{}) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint:
		return int64(v), uint64(v) <= math.MaxInt64
	case uint64:
		return int64(v), v <= math.MaxInt64
	}
	return 0, false
}

// intArgNames is intArgRules by name, in lower and upper case.
var intArgNames = byName(intArgRules)

// named is a rule with the lower-case name of its command.
type named[R any] struct {
	name string // lower case
	rule R
}

// byName maps each command of rules (lower-case names), spelt in lower
// or upper case, to its lower-case name and rule: check looks a command
// up as sent, without lower-casing it.
func byName[R any](rules map[string]R) map[string]named[R] {
	m := make(map[string]named[R], 2*len(rules))
	for n, r := range rules {
		m[n], m[strings.ToUpper(n)] = named[R]{n, r}, named[R]{n, r}
	}
	return m
}

// goInts reports whether args holds a Go integer at each position of at.
func goInts(args []interface{}, at []int) bool {
	for _, i := range at {
		if _, ok := goInt(args[i]); !ok {
			return false
		}
	}
	return true
}

// plainName maps each command of the table that has no rule on its
// arguments, spelt in lower or upper case, to its lower-case name.
var plainName = func() map[string]string {
	m := make(map[string]string, 2*len(commandTable))
	for _, n := range commandTable {
		if rules[n] == nil {
			m[n], m[strings.ToUpper(n)] = n, n
		}
	}
	return m
}()

// checkStrings validates an already formatted command.
func checkStrings(cmd string, args []string) *Violation {
	name := strings.ToLower(cmd)
	reason := ""
	switch {
	case !commandSet[name]:
		reason = notInTable(name)
	default:
		reason = checkArity(name, args)
		if reason == "" {
			if rule := rules[name]; rule != nil {
				reason = rule(args)
			}
		}
	}
	if reason == "" {
		return nil
	}
	return &Violation{Command: strings.ToUpper(cmd), Args: args, Reason: reason}
}

// formatArgs formats arguments exactly as redigo's conn.writeArg does.
func formatArgs(args []interface{}) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = formatArg(a, true)
	}
	return out
}

func formatArg(arg interface{}, argumentOK bool) string {
	switch a := arg.(type) {
	case string:
		return a
	case []byte:
		return string(a)
	case int:
		return strconv.FormatInt(int64(a), 10)
	case int64:
		return strconv.FormatInt(a, 10)
	case float64:
		return strconv.FormatFloat(a, 'g', -1, 64)
	case bool:
		if a {
			return "1"
		}
		return "0"
	case nil:
		return ""
	case redis.Argument:
		if argumentOK {
			return formatArg(a.RedisArg(), false)
		}
		return fmt.Sprint(a)
	default:
		return fmt.Sprint(a)
	}
}

// selfPkg is this package's import path, used to skip its frames.
var selfPkg = reflect.TypeOf(Violation{}).PkgPath()

// callerOutside returns "dir/file.go:line" of the first stack frame that is
// neither in redigo nor in this package's non-test code.
func callerOutside() string {
	var pcs [64]uintptr
	n := runtime.Callers(2, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if f.Function != "" && !internalFrame(f) {
			return shortPath(f.File) + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return ""
		}
	}
}

func internalFrame(f runtime.Frame) bool {
	if strings.Contains(f.Function, "github.com/gomodule/redigo/") {
		return true
	}
	return strings.HasPrefix(f.Function, selfPkg+".") && !strings.HasSuffix(f.File, "_test.go")
}

// shortPath keeps the last directory and the file name: "engine/x.go".
func shortPath(file string) string {
	i := strings.LastIndexByte(file, '/')
	if i < 0 {
		return file
	}
	if j := strings.LastIndexByte(file[:i], '/'); j >= 0 {
		return file[j+1:]
	}
	return file
}
