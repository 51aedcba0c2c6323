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

// TestShardsPoolSize: a server's pool holds pool_size (or its default)
// connections for each lane it carries, since each lane runs its own
// handler slots, each holding a connection while its task runs.
func TestShardsPoolSize(t *testing.T) {
	s, err := parseString(t, `
concurrency: 4
shards:
  lanes: [127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:1, 127.0.0.1:1]
`)
	if err != nil {
		t.Fatal(err)
	}
	pools, closeAll, err := lanePools(s, s.poolSize())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	per := s.poolSize()
	if got := pools[0].MaxActive; got != 3*per {
		t.Errorf("the pool of a server of three lanes holds %d, want 3 x %d", got, per)
	}
	if got := pools[1].MaxActive; got != per {
		t.Errorf("the pool of a server of one lane holds %d, want %d", got, per)
	}
	if pools[0] != pools[2] || pools[0] != pools[3] {
		t.Error("lanes of one server do not share its pool")
	}
}
