package main

import (
	"context"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
)

func TestConfigRedisModeErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown mode", "redis:\n  mode: proxy\n", []string{"cfg.yaml:2", "redis.mode", "single, cluster or sentinel"}},
		{"cluster db", "redis:\n  mode: cluster\n  db: 2\n", []string{"cfg.yaml:3", "redis.db", "database 0 only"}},
		{"sentinel without sentinels", "redis:\n  mode: sentinel\n  sentinel: {master_name: m}\n", []string{"redis.sentinel.addrs", "empty"}},
		{"sentinel without name", "redis:\n  mode: sentinel\n  sentinel: {addrs: ['h:1']}\n", []string{"redis.sentinel.master_name", "empty"}},
		{"replicas in cluster mode", "redis:\n  mode: cluster\n  replicas: ['h:1']\n", []string{"cfg.yaml:3", "redis.replicas", "redis.mode single"}},
		{"seeds in single mode", "redis:\n  seeds: ['h:1']\n", []string{"cfg.yaml:2", "redis.seeds", "redis.mode cluster"}},
		{"sentinel keys in cluster mode", "redis:\n  mode: cluster\n  sentinel: {master_name: m}\n", []string{"redis.sentinel.master_name", "redis.mode sentinel"}},
		{"bad replica", "redis:\n  replicas: [localhost]\n", []string{"cfg.yaml:2", "redis.replicas", "host:port"}},
		{"replica twice", "redis:\n  replicas: ['h:1', 'h:1']\n", []string{"redis.replicas", "twice"}},
		{"replica is addr", "redis:\n  addr: 'h:1'\n  replicas: ['h:1']\n", []string{"redis.replicas", "is redis.addr"}},
		{"role max age", "redis:\n  role_max_age: 0s\n", []string{"cfg.yaml:2", "redis.role_max_age", "positive"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseString(t, c.yaml)
			if err == nil {
				t.Fatalf("no error for %q", c.yaml)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	for _, good := range []string{
		"redis:\n  mode: cluster\n  seeds: ['h:1', 'h:2']\n",
		"redis:\n  mode: sentinel\n  sentinel: {addrs: ['h:1', 'h:2'], master_name: m}\n",
		"redis:\n  addr: 'h:1'\n  replicas: ['h:2']\n  role_max_age: 2s\n",
	} {
		if _, err := parseString(t, good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}

// modeApp is an app on a fresh namespace with the given environment.
func modeApp(t *testing.T, env ...string) (*app, *syncBuffer, *syncBuffer) {
	var out, errOut syncBuffer
	env = append([]string{"ENGINE_NAMESPACE=" + redistest.Namespace(t), "ENGINE_IDLE_WAIT=1s", "ENGINE_REDIS_READ_TIMEOUT=5s"}, env...)
	return &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, environ: env}, &out, &errOut
}

// enqueueAndLookup enqueues a task with the CLI and looks it up.
func enqueueAndLookup(t *testing.T, a *app, out *syncBuffer, errOut *syncBuffer) {
	t.Helper()
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x", "--in", "1h"}); code != 0 {
		t.Fatalf("enqueue: exit %d: %s", code, errOut.String())
	}
	id := strings.TrimSpace(out.String())
	out2 := &syncBuffer{}
	a.stdout = out2
	if code := a.main(context.Background(), []string{"lookup", id, "--json"}); code != 0 || !strings.Contains(out2.String(), `"state": "scheduled"`) {
		t.Fatalf("lookup %s: exit %d: %s %s", id, code, out2.String(), errOut.String())
	}
}

// TestClusterModeCLI enqueues and looks up with redis.mode cluster, a
// seed node given as redis.addr.
func TestClusterModeCLI(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	a, out, errOut := modeApp(t, "ENGINE_REDIS_MODE=cluster", "ENGINE_REDIS_ADDR="+c.Nodes[1].Addr,
		"ENGINE_REDIS_SEEDS="+c.Nodes[2].Addr)
	enqueueAndLookup(t, a, out, errOut)
}

// TestSentinelModeCLI enqueues and looks up with redis.mode sentinel.
func TestSentinelModeCLI(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	a, out, errOut := modeApp(t, "ENGINE_REDIS_MODE=sentinel", "ENGINE_REDIS_SENTINEL_ADDRS="+strings.Join(s.SentinelAddrs(), ","),
		"ENGINE_REDIS_SENTINEL_MASTER_NAME="+s.Name)
	enqueueAndLookup(t, a, out, errOut)
}

// TestSentinelReplicasCLI lists a primary that is a replica (Redis 2.4
// style, redis.mode single with replicas): the CLI refuses to write,
// naming the roles; after SLAVEOF NO ONE it writes.
func TestSentinelReplicasCLI(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.Private())
	replica := redistest.Start(t, redistest.Private())
	admin := replica.Admin(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if _, err := admin.Do("SLAVEOF", host, port); err != nil {
		t.Fatal(err)
	}
	a, _, errOut := modeApp(t, "ENGINE_REDIS_ADDR="+replica.Addr, "ENGINE_REDIS_REPLICAS="+primary.Addr+"x")
	if code := a.main(context.Background(), []string{"stats"}); code != exitUsage {
		t.Errorf("a bad replica address: exit %d, want %d: %s", code, exitUsage, errOut.String())
	}
	// The listed server is a replica, and its master is not listed.
	a, out, errOut := modeApp(t, "ENGINE_REDIS_ADDR="+replica.Addr, "ENGINE_REDIS_REPLICAS=127.0.0.1:1",
		"ENGINE_REDIS_ROLE_MAX_AGE=100ms")
	if code := a.main(context.Background(), []string{"enqueue", "--type", "x"}); code == 0 {
		t.Fatalf("enqueue to a replica succeeded: %s", out.String())
	}
	if s := errOut.String(); !strings.Contains(s, "role:slave") || !strings.Contains(s, "SLAVEOF NO ONE") {
		t.Errorf("refusal does not name the roles and the remedy:\n%s", s)
	}
	if _, err := admin.Do("SLAVEOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	errOut2 := &syncBuffer{}
	a.stderr = errOut2
	enqueueAndLookup(t, a, out, errOut2)
}
