package engine_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// TestReadmeLibraryExample builds the README's library example as the
// program it is and runs it against a real Redis: only its address is
// changed (the test server's, and a namespace of this test's own). It
// must print the task's outcome.
func TestReadmeLibraryExample(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Use it as a library\n")
	if !ok {
		t.Fatal(`README.md has no "Use it as a library" section`)
	}
	m := regexp.MustCompile("(?s)^\\s*```go\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the library section does not start with a go block")
	}
	const addr, ns = `"redis://localhost:6379/0"`, `Namespace: "app"`
	prog := m[1]
	if !strings.Contains(prog, addr) || !strings.Contains(prog, ns) {
		t.Fatalf("the example no longer connects to %s with %s:\n%s", addr, ns, prog)
	}
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	if pw := os.Getenv(redistest.EnvPassword); pw != "" {
		url = "redis://:" + pw + "@" + srv.Addr
	}
	space := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, space) })
	prog = strings.Replace(prog, addr, `"`+url+`"`, 1)
	prog = strings.Replace(prog, ns, `Namespace: "`+space+`"`, 1)

	// A directory of this module, so that the program builds against
	// this tree; testdata keeps it out of ./... .
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("testdata", "readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build the example: %v", err)
	}
	vet, err := exec.CommandContext(ctx, goBin, "vet", "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go vet of the README's example: %v\n%s", err, vet)
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, goBin, "run", "./"+dir)
	cmd.Stderr = &stderr // the engine's log
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the README's example failed: %v\n%s%s", err, out, stderr.String())
	}
	if got := strings.TrimSpace(string(out)); got != "done hello, world" {
		t.Fatalf("the README's example printed %q, want %q", got, "done hello, world")
	}
}
