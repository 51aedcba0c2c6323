package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionShowsVCS: a build without -X main.version whose build info
// has the VCS revision (go build in a checkout) shows the revision, its
// time and whether the tree was modified, not "(devel)"; one without any
// (go run) says why it has no revision.
func TestVersionShowsVCS(t *testing.T) {
	t.Parallel()
	vcs := []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "c1ccd73becf5b7706e50e14f2863fb69655e3248"},
		{Key: "vcs.time", Value: "2026-11-28T16:28:22Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, c := range []struct {
		name, ld string
		bi       *debug.BuildInfo
		want     []string
	}{
		{"devel with vcs", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			[]string{"c1ccd73becf5", "2026-11-28T16:28:22Z", "modified"}},
		{"pseudo-version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261128162822-c1ccd73becf5+dirty"}, Settings: vcs},
			[]string{"v0.0.0-20261128162822-c1ccd73becf5+dirty", "2026-11-28T16:28:22Z", "modified"}},
		{"ldflags", "v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			[]string{"v1.2.3", "c1ccd73becf5", "2026-11-28T16:28:22Z"}},
		{"go run", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			[]string{"no VCS revision"}},
	} {
		got := formatVersion(c.ld, c.bi)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q does not contain %q", c.name, got, w)
			}
		}
		if strings.Contains(got, "(devel)") {
			t.Errorf("%s: %q says (devel)", c.name, got)
		}
	}
}
