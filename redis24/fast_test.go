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
