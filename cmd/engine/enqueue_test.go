package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// countingReader gives n zero bytes and counts what was read.
type countingReader struct{ n, read int }

func (r *countingReader) Read(p []byte) (int, error) {
	if r.read >= r.n {
		return 0, io.EOF
	}
	k := min(len(p), r.n-r.read)
	clear(p[:k])
	r.read += k
	return k, nil
}

// TestEnqueueReadsStdinOnlyWhenAsked: without --payload - or
// --payload-file -, enqueue leaves stdin alone (inside a `while read`
// loop it must not swallow the loop's input).
func TestEnqueueReadsStdinOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range []struct {
		args []string
		read bool
	}{
		{[]string{"--payload", "given"}, false},
		{nil, false},
		{[]string{"--payload", "-"}, true},
		{[]string{"--payload-file", "-"}, true},
	} {
		a, out, errOut := inproc(t, srv)
		stdin := &countingReader{n: 5}
		a.stdin = stdin
		if code := a.main(context.Background(), append([]string{"enqueue", "--type", "x"}, c.args...)); code != 0 {
			t.Fatalf("enqueue %v: exit %d: %s", c.args, code, errOut.String())
		}
		if (stdin.read > 0) != c.read {
			t.Errorf("enqueue %v read %d bytes of stdin; want reading: %v", c.args, stdin.read, c.read)
		}
		a.stdout = &syncBuffer{}
		if code := a.main(context.Background(), []string{"lookup", strings.TrimSpace(out.String()), "--json"}); code != 0 {
			t.Errorf("lookup: exit %d", code)
		}
	}
}

// TestEnqueuePayloadLimit: an oversized payload is refused after reading
// max_payload + 1 bytes of it, not all of it.
func TestEnqueuePayloadLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, _, errOut := inproc(t, srv, "ENGINE_MAX_PAYLOAD=1024")
	stdin := &countingReader{n: 100 << 20}
	a.stdin = stdin
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--payload", "-"}); code != exitUsage {
		t.Errorf("oversized payload: exit %d, want %d: %s", code, exitUsage, errOut.String())
	}
	if stdin.read > 1025 {
		t.Errorf("read %d bytes of a 100 MB payload, want at most max_payload + 1 = 1025", stdin.read)
	}
	if !strings.Contains(errOut.String(), "payload") {
		t.Errorf("stderr %q does not name the payload", errOut.String())
	}
}

// TestEnqueuePayloadSizeTrue: a payload over max_payload is reported with
// its real size (a file's, from its metadata), or as "more than" the limit
// when only the limit was read (stdin): never as limit+1 bytes.
func TestEnqueuePayloadSizeTrue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 << 20); err != nil { // sparse: no 100 MB written
		t.Fatal(err)
	}
	f.Close()
	a, _, errOut := inproc(t, srv, "ENGINE_MAX_PAYLOAD=1024")
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--payload-file", path}); code != exitUsage {
		t.Errorf("oversized payload file: exit %d, want %d: %s", code, exitUsage, errOut.String())
	}
	if msg := errOut.String(); !strings.Contains(msg, "104857600 bytes") || strings.Contains(msg, "1025") {
		t.Errorf("stderr %q: want the file's size, 104857600 bytes, and not the 1025 bytes read", msg)
	}
	a, _, errOut = inproc(t, srv, "ENGINE_MAX_PAYLOAD=1024")
	a.stdin = &countingReader{n: 100 << 20}
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--payload", "-"}); code != exitUsage {
		t.Errorf("oversized stdin payload: exit %d, want %d: %s", code, exitUsage, errOut.String())
	}
	if msg := errOut.String(); !strings.Contains(msg, "more than 1024 bytes") || strings.Contains(msg, "1025") {
		t.Errorf("stderr %q: want \"more than 1024 bytes\", and not the 1025 bytes read", msg)
	}
}

// TestEnqueueRefusesBadType: a task type with spaces or control
// characters is refused before anything is written (exit 2).
func TestEnqueueRefusesBadType(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, typ := range []string{"bad type", "tab\there", " lead"} {
		a, out, errOut := inproc(t, srv)
		if code := a.main(context.Background(), []string{"enqueue", "--type", typ}); code != exitUsage {
			t.Errorf("--type %q: exit %d, want %d; stdout %q stderr %q", typ, code, exitUsage, out.String(), errOut.String())
		}
	}
}

// TestRelativeFarFuture: a due time centuries ahead prints in years, not
// as an overflowed Duration.
func TestRelativeFarFuture(t *testing.T) {
	now := time.Now()
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, want := relative(far, now), fmt.Sprintf("in %d years", 3000-now.Year()); got != want {
		t.Errorf("relative(year 3000) = %q, want %q", got, want)
	}
	if got := relative(now.Add(-72*time.Hour), now); got != "3 days ago" {
		t.Errorf("relative(-72h) = %q", got)
	}
	if got := relative(now.Add(1500*time.Millisecond), now); got != "in 1.5s" {
		t.Errorf("relative(1.5s) = %q", got)
	}
	if s := stamp(far); strings.Contains(s, "h") && strings.Contains(s, "2562047") {
		t.Errorf("stamp(year 3000) = %q", s)
	}
}

// TestStatsNextDueSkipsCancelled: a cancelled task is not shown as the
// queue's next due task (its emptied bucket stays in the index until due).
func TestStatsNextDueSkipsCancelled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, out, errOut := inproc(t, srv)
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--queue", "q", "--in", "1h"}); code != 0 {
		t.Fatalf("enqueue: exit %d: %s", code, errOut.String())
	}
	id := strings.TrimSpace(out.String())
	if code := a.main(context.Background(), []string{"cancel", id}); code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, errOut.String())
	}
	js := &syncBuffer{}
	a.stdout = js
	if code := a.main(context.Background(), []string{"stats", "--json"}); code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(js.String(), `"queue": "q"`) || !strings.Contains(js.String(), `"next_due": null`) {
		t.Errorf("stats after cancelling the only scheduled task:\n%s\nwant next_due null", js.String())
	}
}

// TestEnqueuePriority: --priority sets the task's level, lookup shows it,
// `tasks list --priority` keeps that level's tasks, and a level out of
// 1..4 is refused as a usage error before anything is sent.
func TestEnqueuePriority(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	base, _, _ := inproc(t, srv)
	run := func(args ...string) (int, string, string) {
		a, out, errOut := inproc(t, srv)
		a.environ = base.environ // one namespace for every command
		code := a.main(context.Background(), args)
		return code, out.String(), errOut.String()
	}
	ids := map[string]string{}
	for _, lvl := range []string{"1", "3"} {
		code, out, errOut := run("enqueue", "--type", "x", "--priority", lvl)
		if code != 0 {
			t.Fatalf("enqueue --priority %s: exit %d: %s", lvl, code, errOut)
		}
		ids[lvl] = strings.TrimSpace(out)
	}
	code, out, errOut := run("lookup", ids["3"])
	if code != 0 {
		t.Fatalf("lookup: exit %d: %s", code, errOut)
	}
	if !regexp.MustCompile(`(?m)^priority +3$`).MatchString(out) {
		t.Errorf("lookup does not show level 3:\n%s", out)
	}
	if code, out, errOut := run("lookup", ids["1"], "--json"); code != 0 || !strings.Contains(out, `"priority": 1`) {
		t.Errorf("lookup --json: exit %d: %s%s; want \"priority\": 1", code, out, errOut)
	}
	code, out, errOut = run("tasks", "list", "--state", "ready", "--priority", "3", "--json")
	if code != 0 {
		t.Fatalf("tasks list --priority 3: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, ids["3"]) || strings.Contains(out, ids["1"]) {
		t.Errorf("tasks list --priority 3 lists:\n%s\nwant %s and not %s", out, ids["3"], ids["1"])
	}
	for _, args := range [][]string{
		{"enqueue", "--type", "x", "--priority", "0"},
		{"enqueue", "--type", "x", "--priority", "5"},
		{"tasks", "list", "--state", "ready", "--priority", "5"},
		{"tasks", "list", "--state", "ready", "--priority", "-1"},
	} {
		if code, _, errOut := run(args...); code != exitUsage || !strings.Contains(errOut, "--priority") {
			t.Errorf("%v: exit %d, stderr %q; want %d naming --priority", args, code, errOut, exitUsage)
		}
	}
}
