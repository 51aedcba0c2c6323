package main

import (
	"strings"
	"testing"
)

// TestE2EEnqueueID: a second enqueue with the same --id writes nothing and
// exits 5 saying the id exists; the first task is untouched.
func TestE2EEnqueueID(t *testing.T) {
	h := newHarness(t)
	if id := h.enqueue("--type", "append", "--id", "order-42", "--payload", "first", "--in", "1h"); id != "order-42" {
		t.Fatalf("enqueue --id printed %q", id)
	}
	out, errOut, code := h.cli("enqueue", "--type", "append", "--id", "order-42", "--payload", "second")
	if code != exitExists || !strings.Contains(errOut, "exists") || out != "" {
		t.Fatalf("second enqueue --id: exit %d, stdout %q, stderr %q; want exit %d saying it exists", code, out, errOut, exitExists)
	}
	if l := h.lookup("order-42"); l.State != "scheduled" {
		t.Fatalf("lookup = %+v, want the first task, still scheduled", l)
	}
	if _, errOut, code := h.cli("enqueue", "--type", "append", "--id", "has space"); code != exitUsage || !strings.Contains(errOut, "id") {
		t.Fatalf("enqueue with a bad id: exit %d %q, want %d", code, errOut, exitUsage)
	}
}

// TestE2ECheck: check reports a damaged gauge and an orphan bucket, exits
// 6; --repair fixes both; a second check exits 0.
func TestE2ECheck(t *testing.T) {
	h := newHarness(t)
	h.enqueue("--type", "append", "--payload", "x", "--in", "1h")
	h.ok("check") // healthy: exit 0
	ns := ""
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}
	admin := h.srv.Admin(t)
	if _, err := admin.Do("HINCRBY", "{"+ns+"}:st:default", "running", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("RPUSH", "{"+ns+"}:b:default:1795386251000", "ghost"); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := h.cli("check")
	if code != exitFindings || !strings.Contains(out, "running") || !strings.Contains(out, "b:default:1795386251000") {
		t.Fatalf("check of a damaged namespace: exit %d\nstdout: %s\nstderr: %s\nwant exit %d naming the gauge and the bucket", code, out, errOut, exitFindings)
	}
	h.ok("check", "--repair")
	if out, errOut, code := h.cli("check"); code != 0 {
		t.Fatalf("check after --repair: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
}
