package redis24

import (
	"strings"
	"testing"
)

// TestFastPathAgrees: check's fast path (names without argument rules)
// gives the same verdict as the full check, for every command of the
// table in both cases and for 0 to 5 arguments.
func TestFastPathAgrees(t *testing.T) {
	args := []interface{}{"k", 1, "v", []byte("x"), int64(-2)}
	fast := 0
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
			}
		}
	}
	if fast == 0 {
		t.Error("no command took the fast path")
	}
}
