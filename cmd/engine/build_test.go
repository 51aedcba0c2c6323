package main

import (
	"os"
	"os/exec"
	"testing"
)

// TestBuildsElsewhere: the process-group code is behind build tags, so
// the binary compiles for Windows and macOS too. It compiles the package
// and its dependencies for each (go list -export fails on any compile
// error) without linking a binary nobody runs, which cost as much again.
func TestBuildsElsewhere(t *testing.T) {
	t.Parallel()
	for _, goos := range []string{"windows", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-export", "-f", "{{.Export}}", ".")
			cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("GOOS=%s go list -export: %v\n%s", goos, err, out)
			}
		})
	}
}
