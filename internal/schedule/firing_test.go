package schedule

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// validTaskID is the engine's rule for caller-chosen ids: 1 to 128 bytes,
// printable ASCII, no white space.
func validTaskID(id string) bool {
	if len(id) < 1 || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func TestFiringID(t *testing.T) {
	at := utc("2026-03-29T01:00:00Z")
	long := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name   string
		firing time.Time
		want   string // exact, or a prefix ending in '~' for a hashed name
	}{
		{"nightly-report", at, "p:nightly-report@20260329T010000Z"},
		{"billing/eu:daily_v2", at, "p:billing/eu:daily_v2@20260329T010000Z"},
		{"n", utc("2026-03-29T01:00:00.25Z"), "p:n@20260329T010000.25Z"},
		{"n", utc("2026-03-29T01:00:00.000000001Z"), "p:n@20260329T010000.000000001Z"},
		{"n", utc("0999-01-02T03:04:05Z"), "p:n@09990102T030405Z"},
		{"n", time.Date(12026, 1, 1, 0, 0, 0, 0, time.UTC), "p:n@u" + strconv.FormatInt(time.Date(12026, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), 10) + "Z"},
		{"nightly report", at, "p:nightly_report~"},
		{"Nächtlicher Bericht", at, "p:N_chtlicher_Bericht~"},
		{"a@b", at, "p:a_b~"},
		{"tilde~name", at, "p:tilde_name~"},
		{long, at, "p:" + strings.Repeat("x", 128-2-1-16-1-16) + "~"},
	} {
		got := FiringID(tc.name, tc.firing)
		if !validTaskID(got) {
			t.Errorf("FiringID(%q) = %q: not a valid task id", tc.name, got)
		}
		if strings.HasSuffix(tc.want, "~") {
			if !strings.HasPrefix(got, tc.want) || !strings.HasSuffix(got, "@"+formatStamp(tc.firing)) {
				t.Errorf("FiringID(%q) = %q, want %s<hash>@%s", tc.name, got, tc.want, formatStamp(tc.firing))
			}
		} else if got != tc.want {
			t.Errorf("FiringID(%q, %v) = %q, want %q", tc.name, tc.firing, got, tc.want)
		}
		if again := FiringID(tc.name, tc.firing); again != got {
			t.Errorf("FiringID(%q) not deterministic: %q then %q", tc.name, got, again)
		}
	}
	// The zone of the firing does not matter, only the instant.
	ny, _ := time.LoadLocation("America/New_York")
	if FiringID("x", at) != FiringID("x", at.In(ny)) {
		t.Error("FiringID depends on the firing's zone")
	}
}

func TestFiringIDDistinct(t *testing.T) {
	names := []string{
		"a", "b", "a:b", "a_b", "a b", "a@b", "a~b", "A", "report", "report ", "Report",
		"p:a", "a@20260101T000000Z", "nightly report", "nightly_report", "nightly-report",
		strings.Repeat("y", 105), strings.Repeat("y", 106), strings.Repeat("y", 107), strings.Repeat("y", 200),
		strings.Repeat("y", 200) + "1", strings.Repeat("y", 200) + "2", "Ünïcode", "Ünïcöde", "",
	}
	firings := []time.Time{
		utc("2026-01-01T00:00:00Z"), utc("2026-01-01T00:00:01Z"), utc("2026-01-01T00:00:00.5Z"),
		utc("2026-01-01T00:00:00.05Z"), utc("1970-01-01T00:00:00Z"), utc("2126-01-01T00:00:00Z"),
	}
	seen := map[string]string{}
	for _, n := range names {
		for _, f := range firings {
			id := FiringID(n, f)
			if !validTaskID(id) {
				t.Errorf("FiringID(%q, %v) = %q: not a valid task id", n, f, id)
			}
			key := n + " @ " + f.String()
			if prev, ok := seen[id]; ok {
				t.Errorf("FiringID gives %q for both %s and %s", id, prev, key)
			}
			seen[id] = key
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, good := range []string{"a", "nightly-report", "Nightly report (EU)", "Nächtlich", "日次レポート", strings.Repeat("n", MaxNameLen)} {
		if err := ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q) = %v", good, err)
		}
	}
	for _, tc := range []struct{ name, want string }{
		{"", "empty"},
		{strings.Repeat("n", MaxNameLen+1), "257 bytes long; at most 256"},
		{"bad\xffutf8", "not valid UTF-8"},
		{" lead", "white space"},
		{"trail\n", "white space"},
		{"tab\there", "U+0009 at byte 3 is not printable"},
		{"zero\u200bwidth", "U+200B"},
		{"bell\a", "U+0007"},
	} {
		err := ValidateName(tc.name)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
}
