package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// TestConfigPeriodic: the periodic: list lands in engine entries; bad
// items are reported with file:line and key.
func TestConfigPeriodic(t *testing.T) {
	s, err := parseString(t, `
periodic:
  - {name: nightly, cron: "30 2 * * *", tz: Europe/Berlin, type: report, missed: "all:3"}
  - name: tick
    every: 1m
    type: ping
    payload: hello
    skip_if_running: true
    timeout: 10s
`)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.periodics()
	if err != nil {
		t.Fatal(err)
	}
	want := []engine.Periodic{
		{Name: "nightly", Cron: "30 2 * * *", Location: "Europe/Berlin", Type: "report", Missed: "all:3", Payload: []byte{}},
		{Name: "tick", Every: time.Minute, Type: "ping", Payload: []byte("hello"), SkipIfRunning: true, Timeout: 10 * time.Second},
	}
	if len(ps) != 2 || ps[0].Cron != want[0].Cron || ps[0].Location != want[0].Location || ps[0].Missed != "all:3" ||
		ps[1].Every != want[1].Every || string(ps[1].Payload) != "hello" || !ps[1].SkipIfRunning || ps[1].Timeout != want[1].Timeout {
		t.Fatalf("periodics %+v", ps)
	}
	_, err = parseString(t, `
periodic:
  - {name: a, cron: "61 * * * *", type: t}
  - {name: b, every: 1m, type: t, colour: red}
  - {name: c, every: soon, type: t}
  - {name: a, every: 1m, type: t, missed: twice}
`)
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"cfg.yaml:3: periodic[0]: periodic entry \"a\": invalid schedule",
		"cfg.yaml:4: periodic[1].colour: unknown key", "cfg.yaml:5: periodic[2].every: \"soon\"",
		"cfg.yaml:6: periodic[3].name: \"a\" declared twice", "cfg.yaml:6: periodic[3]: periodic entry \"a\": invalid missed policy"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestDaemonPeriodic: an entry of the daemon's configuration runs through
// its type's handler, and `periodic list` (JSON and table) shows it
// declared by the live daemon.
func TestDaemonPeriodic(t *testing.T) {
	h := newHarness(t)
	p := h.startRun([]string{`ENGINE_PERIODIC=[{name: every-second, every: 1s, type: append, payload: tick}]`})
	h.eventually(15*time.Second, "two firings to run", func() bool {
		return strings.Count(h.file("out"), "tick p:every-second@") >= 2
	})
	var ls []engine.PeriodicStatus
	if err := json.Unmarshal([]byte(h.ok("periodic", "list", "--json")), &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].Name != "every-second" || ls[0].Every != "1s" || ls[0].Declarers != 1 || ls[0].Orphaned ||
		ls[0].Next.IsZero() || ls[0].Last.IsZero() {
		t.Fatalf("periodic list: %+v", ls)
	}
	if out := h.ok("periodic", "list"); !strings.Contains(out, "every-second") || !strings.Contains(out, "1 live") {
		t.Fatalf("periodic list:\n%s", out)
	}
	if code, _ := p.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
