package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeDaemonBlock is the first ```sh block under the README's "Run it as
// a daemon" heading.
func readmeDaemonBlock(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Run it as a daemon\n")
	if !ok {
		t.Fatal("README.md has no \"Run it as a daemon\" section")
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the daemon section has no sh block")
	}
	return m[1]
}

// TestReadmeQuickStart runs the README's daemon commands verbatim, from a
// copy of the repository root (symlinks, so bin/ lands in the copy),
// against a real Redis, and checks the task it enqueues reaches done.
func TestReadmeQuickStart(t *testing.T) {
	h := newHarness(t)
	block := readmeDaemonBlock(t)
	root := t.TempDir()
	entries, err := os.ReadDir("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "bin" || e.Name() == ".git" {
			continue
		}
		abs, _ := filepath.Abs(filepath.Join("../..", e.Name()))
		if err := os.Symlink(abs, filepath.Join(root, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(h.dir, "readme.out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sh := exec.Command("sh", "-ex", "-c", block)
	sh.Dir, sh.Stdout, sh.Stderr = root, f, f
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the daemon started with & is in this group
	goflags := "-trimpath"
	for _, kv := range h.env {
		if f, ok := strings.CutPrefix(kv, "GOFLAGS="); ok {
			goflags = strings.TrimSpace(f + " " + goflags)
		} else if !strings.HasPrefix(kv, "ENGINE_CONFIG=") { // the README names its own config file
			sh.Env = append(sh.Env, kv)
		}
	}
	// The copy's packages are in another directory: with their paths
	// trimmed, the README's go build finds them compiled by TestMain's
	// instead of compiling the whole module again.
	sh.Env = append(sh.Env, "GOFLAGS="+goflags)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-sh.Process.Pid, syscall.SIGTERM) })
	done := make(chan error, 1)
	go func() { done <- sh.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("README block: %v\n%s", err, h.file("readme.out"))
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("README block did not finish\n%s", h.file("readme.out"))
	}
	id := readmeTaskID(h.file("readme.out"))
	if id == "" {
		t.Fatalf("no task id in the README block's trace:\n%s", h.file("readme.out"))
	}
	h.eventually(30*time.Second, "the README's task to be done", func() bool {
		var l taskJSON
		stdout, _, code := h.cli("lookup", id, "--json")
		return code == 0 && json.Unmarshal([]byte(stdout), &l) == nil && l.State == "done"
	})
	if _, err := os.Stat(filepath.Join(root, "bin", "engine")); err != nil {
		t.Errorf("the README's build command did not write bin/engine: %v", err)
	}
}

// readmeTaskIDRE finds the id the README block's enqueue printed. The shell's
// trace line is "+ id=…", but the daemon started with & writes to the same
// file, and its log lines can land anywhere in that line: after the "+ ", or
// straight after the id with no newline between. A generated id is exactly 22
// base62 digits, so the match needs no line anchors.
var readmeTaskIDRE = regexp.MustCompile(`\bid=([0-9A-Za-z]{22})`)

// readmeTaskID is the id in the README block's trace, or "" when there is none.
func readmeTaskID(trace string) string {
	m := readmeTaskIDRE.FindStringSubmatch(trace)
	if m == nil {
		return ""
	}
	return m[1]
}

// The daemon's log lines interleave with the shell's trace in every way a
// run has shown; each still yields the id.
func TestReadmeTaskID(t *testing.T) {
	const id = "0355KHJ5BBsT4aTYoKGo96"
	for _, trace := range []string{
		"+ id=" + id + "\n+ bin/engine lookup " + id + "\n",
		"+ time=2026-11-28T08:27:35.775Z level=INFO msg=\"reaper started\"\nid=" + id + "\n",
		"+ id=" + id + "time=2026-11-28T08:27:35.776Z level=INFO msg=\"worker started\" worker=ac302dc8\n",
	} {
		if got := readmeTaskID(trace); got != id {
			t.Errorf("readmeTaskID(%q) = %q, want %q", trace, got, id)
		}
	}
	if got := readmeTaskID("+ id=\n"); got != "" {
		t.Errorf("an empty id gave %q", got)
	}
}
