package main

import (
	"strings"
	"testing"
)

func TestShardsConfig(t *testing.T) {
	s, _, err := loadSettings(source{file: strings.NewReader("shards:\n  version: 3\n  lanes: [10.0.0.1:6379, 10.0.0.2:6379, 10.0.0.1:6379]\n"), fileName: "cfg.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Shards.Version != 3 || len(s.Shards.Lanes) != 3 || s.Shards.Lanes[1] != "10.0.0.2:6379" || !s.sharded() {
		t.Fatalf("shards: %+v", s.Shards)
	}
	if got := s.where("shards.lanes"); got != "cfg.yaml:3" {
		t.Errorf("shards.lanes from %q", got)
	}
	for _, c := range []struct{ env, want string }{
		{"ENGINE_SHARDS_LANES=10.0.0.1:6379,nonsense", `shards.lanes[1]: "nonsense": want host:port`},
		{"ENGINE_SHARDS_VERSION=-1", "shards.version: -1"},
		{"ENGINE_SHARDS_VERSION=2", "without shards.lanes"},
	} {
		_, _, err := loadSettings(source{environ: []string{c.env}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.env, err, c.want)
		}
	}
}
