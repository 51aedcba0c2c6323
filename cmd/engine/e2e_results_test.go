package main

import (
	"strings"
	"testing"
)

// TestE2EEnqueueWait: enqueue --wait against the daemon prints the
// handler's stdout and exits 0; lookup shows that result; a failing
// handler exits 8 after its last attempt; a timeout exits 10.
func TestE2EEnqueueWait(t *testing.T) {
	h := newHarness(t)
	h.startRun(nil)
	out, errOut, code := h.cli("enqueue", "--type", "echo", "--payload", "world", "--wait", "--wait-timeout", "20s")
	if code != 0 || out != "hello world" {
		t.Fatalf("enqueue --wait: exit %d, stdout %q, stderr %q; want 0 and the handler's stdout", code, out, errOut)
	}
	id := strings.TrimSpace(errOut)
	if look := h.ok("lookup", id); !strings.Contains(look, "result (11 bytes):\nhello world\n") {
		t.Fatalf("lookup does not show the result:\n%s", look)
	}
	if l := h.lookup(id); string(l.Result) != "hello world" {
		t.Fatalf("lookup --json result %q", l.Result)
	}
	out, errOut, code = h.cli("enqueue", "--type", "flaky", "--max-attempts", "1", "--wait", "--wait-timeout", "20s")
	if code != exitWaitDead || out != "" || !strings.Contains(errOut, "died") || !strings.Contains(errOut, "exited with status 3") {
		t.Fatalf("failing handler: exit %d, stdout %q, stderr %q; want %d saying it died", code, out, errOut, exitWaitDead)
	}
	_, errOut, code = h.cli("enqueue", "--type", "echo", "--in", "1h", "--wait", "--wait-timeout", "1s")
	if code != exitWaitTimeout || !strings.Contains(errOut, "did not end") {
		t.Fatalf("wait past its timeout: exit %d, stderr %q; want %d", code, errOut, exitWaitTimeout)
	}
	if _, errOut, code := h.cli("enqueue", "--type", "echo", "--wait-timeout", "1s"); code != exitUsage {
		t.Fatalf("--wait-timeout without --wait: exit %d %q", code, errOut)
	}
}

// TestE2EEnqueueUnique: a second enqueue with the same --unique-key while
// the first waits writes nothing, prints the holder's id and exits 7;
// --unique keys on queue, type and payload.
func TestE2EEnqueueUnique(t *testing.T) {
	h := newHarness(t)
	first := h.enqueue("--type", "echo", "--unique-key", "nightly", "--in", "1h")
	out, errOut, code := h.cli("enqueue", "--type", "echo", "--unique-key", "nightly")
	if code != exitDuplicate || strings.TrimSpace(out) != first || !strings.Contains(errOut, first) {
		t.Fatalf("duplicate: exit %d, stdout %q, stderr %q; want %d and the holder %s", code, out, errOut, exitDuplicate, first)
	}
	a := h.enqueue("--type", "echo", "--payload", "x", "--unique", "10m", "--in", "1h")
	if out, _, code := h.cli("enqueue", "--type", "echo", "--payload", "x", "--unique", "10m"); code != exitDuplicate || strings.TrimSpace(out) != a {
		t.Fatalf("--unique duplicate: exit %d, stdout %q", code, out)
	}
	h.enqueue("--type", "echo", "--payload", "y", "--unique", "10m", "--in", "1h")
	h.ok("cancel", first)
	h.enqueue("--type", "echo", "--unique-key", "nightly", "--in", "1h")
	if _, _, code := h.cli("enqueue", "--type", "echo", "--unique", "0s"); code != exitUsage {
		t.Fatalf("--unique 0: exit %d, want %d", code, exitUsage)
	}
}
