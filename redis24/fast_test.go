package redis24

import (
	"math"
	"strings"
	"testing"
)

// TestFastPathAgrees: check's fast path (names without argument rules)
// gives the same verdict as the full check, for every command of the
// table in both cases and for 0 to 5 arguments.
func TestFastPathAgrees(t *testing.T) {
	args := []interface{}{"k", 1, "v", []byte("x"), int64(-2)}
	fast, fastInt := 0, 0
	for _, n := range Commands() {
		for _, name := range []string{n, strings.ToUpper(n)} {
			for k := 0; k <= len(args); k++ {
				got := check(name, args[:k]) == nil
				want := checkStrings(name, formatArgs(args[:k])) == nil
				if got != want {
					t.Errorf("%s with %d arguments: fast path accepts=%v, full check accepts=%v", name, k, got, want)
				}
				if _, ok := plainName[name]; ok && got {
					fast++
				}
				if _, ok := intArgNames[name]; ok && got {
					fastInt++
				}
			}
		}
	}
	if fast == 0 || fastInt == 0 {
		t.Errorf("commands that took the fast path: %d without rules, %d with integer arguments", fast, fastInt)
	}
}

// TestIntArgRules: every command of the integer-argument fast path has
// that rule in the full check, which refuses a non-integer at each of its
// positions and accepts integers there.
func TestIntArgRules(t *testing.T) {
	for n, r := range intArgRules {
		if rules[n] == nil {
			t.Errorf("%s is on the integer-argument fast path but has no rule", n)
			continue
		}
		nargs := -arity[n] - 1
		if arity[n] > 0 {
			nargs = arity[n] - 1
		}
		for _, i := range r.at {
			args := make([]interface{}, nargs)
			for j := range args {
				args[j] = 7
			}
			if v := check(n, args); v != nil {
				t.Errorf("%s with integers: %v", n, v)
			}
			args[i] = "x"
			if check(n, args) == nil || checkStrings(n, formatArgs(args)) == nil {
				t.Errorf("%s with a non-integer at %d: accepted", n, i)
			}
			args[i] = 2.5
			if check(n, args) == nil {
				t.Errorf("%s with a float at %d: accepted", n, i)
			}
			args[i] = uint64(math.MaxInt64) + 1 // formats past int64: 2.4 misreads it
			if check(n, args) == nil {
				t.Errorf("%s with %v at %d: accepted", n, args[i], i)
			}
		}
	}
}

// TestTypedFastAgrees: for each command of the typed fast path, over
// argument lists of several lengths and value types (option words, floats,
// strings, zero, negatives, a uint64 past int64), the fast path accepts
// only what the full check accepts, and accepts the forms the engine sends.
func TestTypedFastAgrees(t *testing.T) {
	values := []interface{}{"k", "NX", "v", 5, int64(-3), 0, 2.5, []byte("7"), uint64(math.MaxInt64) + 1, int64(1700000000000)}
	for n := range typedRules {
		for _, name := range []string{n, strings.ToUpper(n)} {
			for k := 0; k <= 5; k++ {
				args := make([]interface{}, k)
				var walk func(i int)
				walk = func(i int) {
					if i == k {
						if check(name, args) == nil && checkStrings(name, formatArgs(args)) != nil {
							t.Errorf("%s %v: fast path accepts, full check refuses", name, args)
						}
						return
					}
					for _, v := range values {
						args[i] = v
						walk(i + 1)
					}
				}
				walk(0)
			}
		}
	}
	for _, c := range []struct {
		name string
		args []interface{}
	}{
		{"ZADD", []interface{}{"p:w", int64(1700000000000), "id", int64(1700000000001), "id2"}},
		{"SETEX", []interface{}{"t:id", int64(86400), []byte("rec")}},
		{"MSET", []interface{}{"a", []byte("1"), "b", []byte("2")}},
	} {
		tf := typedFast[c.name]
		if !arityOK(tf.name, len(c.args)) || !tf.rule(c.args) {
			t.Errorf("%s %v: not on the typed fast path", c.name, c.args)
		}
		if check(c.name, c.args) != nil {
			t.Errorf("%s %v: refused", c.name, c.args)
		}
	}
	for _, c := range [][]interface{}{{"SETEX", "k", 0, "v"}, {"ZADD", "k", "NX", 1, "m"}, {"ZADD", "k", 1, "m", 2}} {
		if check(c[0].(string), c[1:]) == nil {
			t.Errorf("%v: accepted", c)
		}
	}
}
