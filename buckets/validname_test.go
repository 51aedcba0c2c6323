package buckets

import (
	"regexp"
	"strings"
	"testing"
)

// namePattern is the rule ValidName implements.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

func TestValidNameMatchesPattern(t *testing.T) {
	t.Parallel()
	cases := []string{"", "a", "default", "a.b-c_d", "A9", strings.Repeat("x", 64), strings.Repeat("x", 65),
		"a b", "a:b", "{a}", "é", "a\x00", "a\n", "-", "..", "ü"}
	for _, c := range cases {
		if got, want := ValidName(c), namePattern.MatchString(c); got != want {
			t.Errorf("ValidName(%q) = %v, the pattern says %v", c, got, want)
		}
	}
}

func FuzzValidName(f *testing.F) {
	f.Add("default")
	f.Add("a b")
	f.Add(strings.Repeat("y", 64))
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidName(s), namePattern.MatchString(s); got != want {
			t.Fatalf("ValidName(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
