package compat_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// side is which side of the WATCH differences of docs/compat.md (2 and 3)
// a server is on. The scenarios that hold an EXEC until a watched key
// changed assert what the server did from it, so that the suite passes on
// a real Redis 2.4 as on Redis 7: the version read from INFO decides.
type side int

const (
	// sideUnknown: a version between 2.4 and 7 the suite has not been run
	// on; what its EXEC did is logged, not asserted.
	sideUnknown side = iota
	// side24: a real Redis 2.4 never aborts EXEC for an expired watched
	// key or for RPOPLPUSH creating a watched list.
	side24
	// side7: Redis 7 (and miniredis) abort EXEC in both cases.
	side7
)

func (s side) String() string {
	return [...]string{"unknown", "2.4", "7"}[s]
}

// sideOf maps a redis_version to its side. Versions below 2.4 are refused:
// the engine needs 2.4's command set.
func sideOf(version string) (side, error) {
	parts := strings.SplitN(strings.TrimSpace(version), ".", 3)
	if len(parts) < 2 {
		return sideUnknown, fmt.Errorf("redis_version %q: want major.minor[.patch]", version)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return sideUnknown, fmt.Errorf("redis_version %q: want major.minor[.patch]", version)
	}
	switch {
	case major < 2 || major == 2 && minor < 4:
		return sideUnknown, fmt.Errorf("redis_version %s: older than 2.4, which the engine needs", version)
	case major == 2 && minor == 4:
		return side24, nil
	case major >= 7:
		return side7, nil
	}
	return sideUnknown, nil
}

// serverVersion reads redis_version from INFO, sent without an argument
// (2.4's INFO takes none).
func serverVersion(c redis.Conn) (string, error) {
	info, err := redis.String(c.Do("INFO"))
	if err != nil {
		return "", fmt.Errorf("INFO: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO has no redis_version line")
}

// serverSide reads a real server's version and maps it to its side.
func serverSide(c redis.Conn) (side, string, error) {
	v, err := serverVersion(c)
	if err != nil {
		return sideUnknown, "", err
	}
	s, err := sideOf(v)
	return s, v, err
}

// execOutcome is what a scenario that holds one EXEC until a watched key
// changed expects to count: EXECs answered nil (aborted), times the held
// transaction's EXEC was reached, and nil EXECs the seam replayed.
type execOutcome struct {
	aborts, reached, replays int
}

// watchExpiryOutcome is what scenarioWatchExpiry expects on a server of
// side s, with the seam replaying nil EXECs as 2.4 would (sim24) or not;
// ok is false when the side is unknown (nothing is asserted then).
//
// Where the server aborts (Redis 7, miniredis), the seam's replay stands
// in for 2.4 under sim24 (one abort, replayed, reached once) and txn runs
// the transaction again otherwise (one abort, reached twice). A real 2.4
// server never aborts: one EXEC, nothing to replay, under either name.
func watchExpiryOutcome(s side, sim24 bool) (want execOutcome, ok bool) {
	switch {
	case s == side24:
		return execOutcome{aborts: 0, reached: 1, replays: 0}, true
	case s == side7 && sim24:
		return execOutcome{aborts: 1, reached: 1, replays: 1}, true
	case s == side7:
		return execOutcome{aborts: 1, reached: 2, replays: 0}, true
	}
	return execOutcome{}, false
}

// infoConn answers INFO with a fixed text, as a server of that version.
type infoConn struct {
	fakeConn
	info string
}

func (c *infoConn) Do(name string, args ...interface{}) (interface{}, error) {
	if strings.EqualFold(name, "INFO") && len(args) == 0 {
		return []byte(c.info), nil
	}
	return nil, fmt.Errorf("unexpected %s %v", name, args)
}

// TestServerSide is the decision of which behaviours the suite asserts,
// with the version faked where the suite reads it (INFO).
func TestServerSide(t *testing.T) {
	info := func(v string) string {
		return "# Server\r\nredis_git_sha1:00000000\r\nredis_version:" + v + "\r\narch_bits:64\r\n"
	}
	for _, tc := range []struct {
		version string
		want    side
		err     bool
	}{
		{"2.4.18", side24, false},
		{"2.4.0", side24, false},
		{"7.0.15", side7, false},
		{"7.2.4", side7, false},
		{"8.0.0", side7, false},
		{"2.6.17", sideUnknown, false},
		{"6.2.14", sideUnknown, false},
		{"2.2.12", sideUnknown, true},
		{"1.2.6", sideUnknown, true},
		{"x.y", sideUnknown, true},
		{"7", sideUnknown, true},
	} {
		got, v, err := serverSide(&infoConn{info: info(tc.version)})
		if got != tc.want || (err != nil) != tc.err || (err == nil && v != tc.version) {
			t.Errorf("INFO redis_version:%s: side %v, version %q, err %v; want side %v, error %v", tc.version, got, v, err, tc.want, tc.err)
		}
	}
	if _, _, err := serverSide(&infoConn{info: "# Server\r\narch_bits:64\r\n"}); err == nil {
		t.Errorf("INFO without redis_version: no error")
	}

	// What the watch-expiry scenarios then assert.
	for _, tc := range []struct {
		side  side
		sim24 bool
		want  execOutcome
		ok    bool
	}{
		{side24, false, execOutcome{0, 1, 0}, true},
		{side24, true, execOutcome{0, 1, 0}, true},
		{side7, false, execOutcome{1, 2, 0}, true},
		{side7, true, execOutcome{1, 1, 1}, true},
		{sideUnknown, false, execOutcome{}, false},
		{sideUnknown, true, execOutcome{}, false},
	} {
		if got, ok := watchExpiryOutcome(tc.side, tc.sim24); got != tc.want || ok != tc.ok {
			t.Errorf("watchExpiryOutcome(%v, sim24 %v) = %+v, %v; want %+v, %v", tc.side, tc.sim24, got, ok, tc.want, tc.ok)
		}
	}
}
