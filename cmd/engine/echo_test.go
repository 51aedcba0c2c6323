package main

import (
	"context"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
)

// TestErrorsRedactAndClip: an error never repeats a password given in a
// Redis URL, and repeats at most the first 64 bytes of a long id, type or
// queue name, with its length.
func TestErrorsRedactAndClip(t *testing.T) {
	t.Parallel()
	run := func(env []string, args ...string) string {
		t.Helper()
		a, out, errOut := modeApp(t, env...)
		code := a.main(context.Background(), args)
		if code == 0 {
			t.Errorf("engine %.80s: exit 0, want an error", strings.Join(args, " "))
		}
		return out.String() + errOut.String()
	}
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"lookup", "--redis", "redis://:S3cr3t@127.0.0.1:1", "x"}},
		{nil, []string{"lookup", "--redis", "redis://app:S3cr3t@127.0.0.1:1", "x"}},
		{[]string{"ENGINE_REDIS_ADDR=redis://:S3cr3t@127.0.0.1:1"}, []string{"lookup", "x"}},
		{[]string{"ENGINE_REDIS_MODE=sentinel", "ENGINE_REDIS_SENTINEL_MASTER_NAME=m", "ENGINE_REDIS_SENTINEL_ADDRS=redis://:S3cr3t@127.0.0.1:1"}, []string{"lookup", "x"}},
	} {
		if got := run(c.env, c.args...); strings.Contains(got, "S3cr3t") || !strings.Contains(got, "xxxxx") {
			t.Errorf("engine %v with %v: the password is not redacted:\n%s", c.args, c.env, got)
		}
	}

	srv := redistest.Start(t)
	long := strings.Repeat("A", 100000)
	for _, args := range [][]string{
		{"lookup", long},
		{"enqueue", "--type", "t", "--id", long},
		{"enqueue", "--type", long},
		{"enqueue", "--type", "t", "--queue", long},
	} {
		got := run([]string{"ENGINE_REDIS_ADDR=" + srv.Addr}, args...)
		if len(got) > 1000 || !strings.Contains(got, "(100000 bytes)") {
			t.Errorf("engine %s: %d bytes of output, want the input clipped with its length:\n%.400s", args[0], len(got), got)
		}
	}
}
