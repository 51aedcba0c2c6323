package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/engine
//
// Without it, the module version and VCS revision from the build info are used.
var version = ""

// versionString describes this build.
func versionString() string {
	v := version
	rev, dirty := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		v += " " + rev
	}
	return v
}

func (a *app) cmdVersion(_ context.Context, args []string) int {
	fs := a.newFlags("version", "", "Prints the version, the VCS revision and the Go version of this build.")
	pos, code, ok := a.parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		fmt.Fprintf(a.stderr, "engine version: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	fmt.Fprintf(a.stdout, "engine %s %s\n", versionString(), runtime.Version())
	return exitOK
}
