package redistest

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

// SentinelSet is one master, one replica and three sentinels watching them
// under Name, on loopback, started by StartSentinel.
type SentinelSet struct {
	Name      string
	Master    *Node
	Replica   *Node
	Sentinels []*Node
}

// Sentinel timings: short, so that a killed master is replaced within
// seconds.
const (
	sentinelDownAfter       = 1000 // ms
	sentinelFailoverTimeout = 5000 // ms
)

// StartSentinel starts a master and a replica (redis-server) and three
// sentinels (redis-sentinel, from Debian's redis-sentinel package) with
// quorum 2, and waits until the replica is in sync and every sentinel knows
// the replica and the two other sentinels. Everything is killed and removed
// in t.Cleanup. A missing binary fails the test.
func StartSentinel(t testing.TB) *SentinelSet {
	t.Helper()
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	sbin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		t.Fatalf("redistest: redis-sentinel not found (apt-get install -y redis-sentinel): %v", err)
	}
	parent := t.TempDir()
	const data = "appendonly yes\nappendfsync always\nrepl-diskless-sync-delay 0\n"
	s := &SentinelSet{Name: "bq-master"}
	s.Master = startNode(t, bin, parent, "master", data)
	s.Replica = startNode(t, bin, parent, "replica", data+fmt.Sprintf("replicaof 127.0.0.1 %d\n", s.Master.Port))
	s.waitInSync(t, 20*time.Second)
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %s %d\n"+
		"sentinel failover-timeout %s %d\n"+
		"sentinel parallel-syncs %s 1\n",
		s.Name, s.Master.Port, s.Name, sentinelDownAfter, s.Name, sentinelFailoverTimeout, s.Name)
	for i := range 3 {
		s.Sentinels = append(s.Sentinels, startNode(t, sbin, parent, fmt.Sprintf("sentinel%d", i), conf))
	}
	s.waitAware(t, 30*time.Second)
	return s
}

// SentinelAddrs returns the sentinels' addresses.
func (s *SentinelSet) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr
	}
	return out
}

func (s *SentinelSet) waitInSync(t testing.TB, timeout time.Duration) {
	t.Helper()
	var m map[string]string
	var err error
	testwait.UntilShowing(t, timeout, fmt.Sprintf("replica %s in sync with %s", s.Replica.Addr, s.Master.Addr), func() bool {
		m, err = s.Replica.info("replication")
		return err == nil && m["master_link_status"] == "up"
	}, func() string { return fmt.Sprint(m, err) })
}

func (s *SentinelSet) waitAware(t testing.TB, timeout time.Duration) {
	t.Helper()
	var last string
	testwait.UntilShowing(t, timeout, "every sentinel to see the replica and 2 other sentinels", func() bool {
		for _, n := range s.Sentinels {
			f, err := sentinelMaster(n, s.Name)
			if err != nil || f["num-slaves"] != "1" || f["num-other-sentinels"] != "2" {
				last = fmt.Sprintf("sentinel %s: %v %v", n.Addr, f, err)
				return false
			}
		}
		return true
	}, func() string { return last })
}

func sentinelMaster(n *Node, name string) (map[string]string, error) {
	kv, err := redis.Strings(n.TryDo("SENTINEL", "MASTER", name))
	if err != nil {
		return nil, err
	}
	f := make(map[string]string)
	for i := 0; i+1 < len(kv); i += 2 {
		f[kv[i]] = kv[i+1]
	}
	return f, nil
}

// WaitMaster waits until every running sentinel names addr as the master,
// and fails t after timeout.
func (s *SentinelSet) WaitMaster(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	var last string
	testwait.UntilShowing(t, timeout, "every running sentinel to name "+addr+" as the master", func() bool {
		for _, n := range s.Sentinels {
			got, err := redis.Strings(n.TryDo("SENTINEL", "get-master-addr-by-name", s.Name))
			if err != nil || len(got) != 2 || "127.0.0.1:"+got[1] != addr {
				last = fmt.Sprintf("sentinel %s names %v (%v)", n.Addr, got, err)
				return false
			}
		}
		return true
	}, func() string { return last })
}
