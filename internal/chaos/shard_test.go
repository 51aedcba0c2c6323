package chaos

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envShardScenarios picks the scenarios of TestChaosShards.
const envShardScenarios = "CHAOS_SHARD_SCENARIOS"

// shardScenarios are the scenarios that run on shards (no cutting proxy,
// no bad data); TestChaosShards runs these unless CHAOS_SHARD_SCENARIOS
// says otherwise.
var shardScenarios = []string{"workers", "infra", "producers", "restart", "skew", "kills-restarts"}

// TestChaosShards runs the chaos scenarios on three lanes, each on a
// redis-server of its own: producers write batches of one ShardKey (one
// lane each), workers, dispatchers and reapers serve every lane, restarts
// hit one server at a time; the ledger and the namespace check span the
// lanes. The short form (CI) is 1000 tasks per scenario; CHAOS_TASKS and
// CHAOS_SEED work as for TestChaos.
func TestChaosShards(t *testing.T) {
	if _, err := findRedisServer(); err != nil {
		t.Fatalf("%v", err)
	}
	seed := time.Now().UnixNano()%1_000_000_000 + 1
	if s := os.Getenv(envSeed); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
	}
	tasks := 1000
	if s := os.Getenv(envTasks); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envTasks, s)
		}
		tasks = n
	}
	names := shardScenarios
	if s := os.Getenv(envShardScenarios); s != "" {
		names = strings.Split(s, ",")
	}
	t.Logf("chaos seed %d (replay: %s=%d go test ./internal/chaos -run TestChaosShards)", seed, envSeed, seed)
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	for _, name := range names {
		if _, err := LookupScenario(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var progress io.Writer
			if testing.Verbose() {
				progress = t.Output()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			rep, err := Run(ctx, Options{Scenario: name, Tasks: tasks, Seed: seed, Bin: procBin,
				Drain: 20 * time.Second, Log: progress, Shards: 3})
			if err != nil {
				t.Fatalf("scenario %s on 3 shards (seed %d): %v", name, seed, err)
			}
			t.Log("\n" + rep.String())
			if !rep.OK() {
				t.Errorf("scenario %s on 3 shards (seed %d) failed:\n  %s\n(logs and ledgers kept in %s)",
					name, seed, strings.Join(rep.Failures, "\n  "), rep.Dir)
			}
		})
	}
}

// TestChaosShardsRefusesCuts: scenarios that need the cutting proxy or
// bad data say they do not run on shards, rather than run without them.
func TestChaosShardsRefusesCuts(t *testing.T) {
	_, err := Run(context.Background(), Options{Scenario: "conncut", Shards: 3, Bin: "/nonexistent"})
	if err == nil || !strings.Contains(err.Error(), "not available on shards") {
		t.Fatalf("conncut on shards: %v", err)
	}
}
