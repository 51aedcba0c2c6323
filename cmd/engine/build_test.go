package main

import (
	"os"
	"os/exec"
	"testing"
)

// TestBuildsElsewhere: the process-group code is behind build tags, so
// the binary builds for Windows and macOS too.
func TestBuildsElsewhere(t *testing.T) {
	t.Parallel()
	for _, goos := range []string{"windows", "darwin"} {
		cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go build: %v\n%s", goos, err, out)
		}
	}
}
