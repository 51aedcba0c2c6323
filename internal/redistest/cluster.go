package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

// Node is a redis-server (or redis-sentinel) child process started from a
// config file for a Redis Cluster or Sentinel test. It has no ACL: Cluster
// and Sentinel modes send commands Redis 2.4 lacks (CLUSTER, ASKING,
// SENTINEL, ROLE).
type Node struct {
	// Addr is 127.0.0.1:Port.
	Addr string
	Port int
	// Dir is the node's working directory (config, log, nodes.conf).
	Dir string

	bin, conf, log string
	extraArgs      []string
	mu             sync.Mutex
	cmd            *exec.Cmd
	done           chan struct{}
}

// nodeFreePort returns a free loopback port below 55000 whose +10000
// neighbour (the cluster bus) is free too. Another process may take either
// before the server binds; startNode then tries again.
func nodeFreePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port >= 55000 {
			continue
		}
		if b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			b.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port pair below 55000")
}

// startNode writes config (with "port N", "bind", "dir" prepended) to a new
// directory under parent and starts bin on it, trying other ports if the
// chosen one is taken. The node is killed in t.Cleanup.
func startNode(t testing.TB, bin, parent, name, config string, extraArgs ...string) *Node {
	t.Helper()
	var lastErr error
	for range 5 {
		port, err := nodeFreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		dir := filepath.Join(parent, fmt.Sprintf("%s-%d", name, port))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		n := &Node{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, Dir: dir, bin: bin,
			conf: filepath.Join(dir, "node.conf"), log: filepath.Join(dir, "node.log"), extraArgs: extraArgs,
		}
		head := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsave \"\"\n", port, dir, n.log)
		if err := os.WriteFile(n.conf, []byte(head+config), 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if lastErr = n.start(); lastErr == nil {
			t.Cleanup(n.kill)
			return n
		}
	}
	t.Fatalf("redistest: start %s: %v", name, lastErr)
	return nil
}

func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("node %s already runs", n.Addr)
	}
	cmd := exec.Command(n.bin, append([]string{n.conf}, n.extraArgs...)...)
	cmd.Dir = n.Dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		c, err := redis.Dial("tcp", n.Addr, redis.DialConnectTimeout(time.Second),
			redis.DialReadTimeout(time.Second), redis.DialWriteTimeout(time.Second))
		if err == nil {
			var info string
			info, err = redis.String(c.Do("INFO", "server"))
			c.Close()
			// The server that answers must be this one: when the port was
			// taken meanwhile, another process's server answers while
			// ours exits on "Address already in use".
			if pid, _ := redisinfo.Int(info, "process_id"); err == nil && pid != int64(cmd.Process.Pid) {
				_ = cmd.Process.Kill()
				<-done
				return fmt.Errorf("%s answered from another process: the port was taken", n.Addr)
			}
			if err == nil {
				n.cmd, n.done = cmd, done
				return nil
			}
		}
		select {
		case <-done:
			log, _ := os.ReadFile(n.log)
			return fmt.Errorf("%s exited at start:\n%s", n.Addr, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s: no PONG within %v: %v", n.Addr, startTimeout, err)
		}
	}
}

func (n *Node) kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd, n.done = nil, nil
	n.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// Kill kills the node with SIGKILL, as a crash would, and reaps it.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	n.kill()
}

// Restart starts a killed node again with the same config, port and
// directory.
func (n *Node) Restart(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatalf("redistest: restart %s: %v", n.Addr, err)
	}
}

// Conn dials the node; the connection is closed in t.Cleanup (closing it
// earlier is fine).
func (n *Node) Conn(t testing.TB) redis.Conn {
	t.Helper()
	c, err := redis.Dial("tcp", n.Addr, redis.DialConnectTimeout(ConnectTimeout),
		redis.DialReadTimeout(ReadTimeout), redis.DialWriteTimeout(WriteTimeout))
	if err != nil {
		t.Fatalf("redistest: dial %s: %v", n.Addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Do sends one command on a new connection and fails t on error.
func (n *Node) Do(t testing.TB, cmd string, args ...interface{}) interface{} {
	t.Helper()
	reply, err := n.TryDo(cmd, args...)
	if err != nil {
		t.Fatalf("redistest: %s on %s: %v", cmd, n.Addr, err)
	}
	return reply
}

// TryDo sends one command on a new connection.
func (n *Node) TryDo(cmd string, args ...interface{}) (interface{}, error) {
	c, err := redis.Dial("tcp", n.Addr, redis.DialConnectTimeout(time.Second),
		redis.DialReadTimeout(ReadTimeout), redis.DialWriteTimeout(WriteTimeout))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Do(cmd, args...)
}

// info returns the INFO fields of section on n.
func (n *Node) info(section string) (map[string]string, error) {
	s, err := redis.String(n.TryDo("INFO", section))
	if err != nil {
		return nil, err
	}
	return redisinfo.Fields(s), nil
}

// Cluster is a Redis Cluster of three masters, each with one replica, on
// loopback, started by StartCluster.
type Cluster struct {
	// Nodes are the six nodes, in the order given to redis-cli --cluster
	// create (which makes the first three masters).
	Nodes []*Node
}

// clusterNodeTimeout is cluster-node-timeout in ms: short, so that a killed
// master is replaced within seconds. A node must then never stall that
// long on its own: its append-only file (kept so that a killed node
// restarts with its data) is written at once but fsynced by the kernel
// (appendfsync no), not by the node's main thread on every write, which a
// disk busy with other work slows down past the timeout.
const clusterNodeTimeout = 2000

// StartCluster starts six redis-server nodes with cluster-enabled, joins
// them with `redis-cli --cluster create … --cluster-replicas 1`, and waits
// until every node reports cluster_state:ok and the same slot map. Nodes are
// killed and their directories removed in t.Cleanup. A missing redis-server
// or redis-cli fails the test.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli not found (apt-get install -y redis-tools): %v", err)
	}
	parent := t.TempDir()
	conf := fmt.Sprintf("cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout %d\n"+
		"appendonly yes\nappendfsync no\ncluster-replica-validity-factor 0\nrepl-diskless-sync-delay 0\n", clusterNodeTimeout)
	c := &Cluster{}
	for i := range 6 {
		c.Nodes = append(c.Nodes, startNode(t, bin, parent, fmt.Sprintf("cluster%d", i), conf))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.WaitHealthy(t, 30*time.Second)
	return c
}

// Addrs returns the addresses of the nodes.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Node returns the node at addr, or nil.
func (c *Cluster) Node(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// all give the same slot-to-master map with every slot covered; it fails t
// after timeout.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	var why string
	testwait.UntilShowing(t, timeout, "the cluster to be healthy", func() bool {
		why = c.unhealthy()
		return why == ""
	}, func() string { return why })
}

func (c *Cluster) unhealthy() string {
	var first string
	for _, n := range c.Nodes {
		n.mu.Lock()
		running := n.cmd != nil
		n.mu.Unlock()
		if !running {
			continue
		}
		cm, err := redis.String(n.TryDo("CLUSTER", "INFO"))
		if err != nil {
			return err.Error()
		}
		if !strings.Contains(cm, "cluster_state:ok") || !strings.Contains(cm, "cluster_slots_ok:16384") {
			return n.Addr + ": " + strings.ReplaceAll(cm, "\r\n", " ")
		}
		owners, err := c.SlotOwners(n)
		if err != nil {
			return err.Error()
		}
		s := fmt.Sprint(owners)
		if first == "" {
			first = s
		} else if s != first {
			return "nodes disagree about the slot map"
		}
	}
	return ""
}

// SlotOwners returns, as seen by n, each slot range's master address keyed
// by its first slot.
func (c *Cluster) SlotOwners(n *Node) (map[int]string, error) {
	reply, err := redis.Values(n.TryDo("CLUSTER", "SLOTS"))
	if err != nil {
		return nil, err
	}
	out := make(map[int]string)
	covered := 0
	for _, item := range reply {
		f, err := redis.Values(item, nil)
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("malformed CLUSTER SLOTS entry %v", item)
		}
		start, _ := redis.Int(f[0], nil)
		end, _ := redis.Int(f[1], nil)
		m, _ := redis.Values(f[2], nil)
		if len(m) < 2 {
			return nil, fmt.Errorf("malformed CLUSTER SLOTS node %v", f[2])
		}
		port, _ := redis.Int(m[1], nil)
		out[start] = "127.0.0.1:" + strconv.Itoa(port)
		if len(f) < 4 {
			return nil, fmt.Errorf("%s lists no replica for slots %d-%d", n.Addr, start, end)
		}
		covered += end - start + 1
	}
	if covered != 16384 {
		return nil, fmt.Errorf("%s covers %d slots", n.Addr, covered)
	}
	return out, nil
}

// ID returns the node's cluster id.
func (n *Node) ID(t testing.TB) string {
	t.Helper()
	id, err := redis.String(n.TryDo("CLUSTER", "MYID"))
	if err != nil {
		t.Fatalf("redistest: CLUSTER MYID on %s: %v", n.Addr, err)
	}
	return id
}

// MasterOf returns the node that serves slot, as the first node that
// answers CLUSTER SLOTS sees it.
func (c *Cluster) MasterOf(t testing.TB, slot int) *Node {
	t.Helper()
	for _, n := range c.Nodes {
		reply, err := redis.Values(n.TryDo("CLUSTER", "SLOTS"))
		if err != nil {
			continue
		}
		for _, item := range reply {
			f, _ := redis.Values(item, nil)
			start, _ := redis.Int(f[0], nil)
			end, _ := redis.Int(f[1], nil)
			if slot < start || slot > end {
				continue
			}
			m, _ := redis.Values(f[2], nil)
			port, _ := redis.Int(m[1], nil)
			if node := c.Node("127.0.0.1:" + strconv.Itoa(port)); node != nil {
				return node
			}
		}
	}
	t.Fatalf("redistest: no node serves slot %d", slot)
	return nil
}

// ReplicaOf returns a node that replicates master.
func (c *Cluster) ReplicaOf(t testing.TB, master *Node) *Node {
	t.Helper()
	id := master.ID(t)
	for _, n := range c.Nodes {
		if n == master {
			continue
		}
		m, err := n.info("replication")
		if err != nil || m["role"] != "slave" {
			continue
		}
		if p := m["master_port"]; p == strconv.Itoa(master.Port) {
			return n
		}
	}
	t.Fatalf("redistest: no replica of %s (%s)", master.Addr, id)
	return nil
}

// MigrateSlot moves slot from its master to dst by hand, as redis-cli
// --cluster reshard does: CLUSTER SETSLOT IMPORTING on dst and MIGRATING on
// the source, then MIGRATE one key at a time (calling between after each,
// so a test can act while the slot is half moved), then SETSLOT NODE on
// both and on every other master.
func (c *Cluster) MigrateSlot(t testing.TB, slot int, dst *Node, between func(moved int)) {
	t.Helper()
	src := c.MasterOf(t, slot)
	if src == dst {
		t.Fatalf("redistest: slot %d already lives on %s", slot, dst.Addr)
	}
	srcID, dstID := src.ID(t), dst.ID(t)
	dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	moved := 0
	for {
		keys, err := redis.Strings(src.TryDo("CLUSTER", "GETKEYSINSLOT", slot, 1))
		if err != nil {
			t.Fatalf("redistest: CLUSTER GETKEYSINSLOT on %s: %v", src.Addr, err)
		}
		if len(keys) == 0 {
			break
		}
		src.Do(t, "MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS", keys[0])
		moved++
		if between != nil {
			between(moved)
		}
	}
	for _, n := range []*Node{dst, src} {
		n.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
	}
	for _, n := range c.Nodes {
		if n == src || n == dst {
			continue
		}
		if m, err := n.info("replication"); err == nil && m["role"] == "master" {
			_, _ = n.TryDo("CLUSTER", "SETSLOT", slot, "NODE", dstID)
		}
	}
}
