package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" -o bin/engine ./cmd/engine
//
// Without it, the module version and VCS revision from the build info are used.
var version = ""

// versionString describes this build.
func versionString() string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(version, bi)
}

// formatVersion describes a build whose -X main.version is ld ("" when
// not set) and whose build info is bi (nil when there is none): the
// version, then the commit it was built from, the commit's time and
// whether the tree had changes, from the build info's VCS settings (go
// build in a checkout records them; go run does not).
//
//	v1.2.3 (commit c1ccd73becf5, 2026-11-28T16:28:22Z, modified)
//	devel (commit c1ccd73becf5, 2026-11-28T16:28:22Z)
//	devel (no VCS revision in the build: built by go run, -buildvcs=false or outside a checkout)
func formatVersion(ld string, bi *debug.BuildInfo) string {
	v := ld
	var rev, when string
	dirty := false
	if bi != nil {
		if v == "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	if rev == "" {
		if ld != "" {
			return v
		}
		return v + " (no VCS revision in the build: built by go run, -buildvcs=false or outside a checkout)"
	}
	parts := []string{"commit " + rev[:min(len(rev), 12)]}
	if when != "" {
		parts = append(parts, when)
	}
	if dirty {
		parts = append(parts, "modified")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}

func (a *app) newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Long:  "Prints the version, the VCS revision and the Go version of this build.",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintf(a.stdout, "engine %s %s\n", versionString(), runtime.Version())
		},
	}
}
