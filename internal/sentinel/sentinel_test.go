package sentinel_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/sentinel"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSentinelRoleCheckerFollows24Promotion(t *testing.T) {
	t.Parallel()
	// Servers of the test's own: it turns one into a replica (SLAVEOF).
	primary := redistest.Start(t, redistest.Private())
	configured := redistest.Start(t, redistest.Private()) // the server the engine is configured to write to
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, port, _ := net.SplitHostPort(primary.Addr)
	admin := configured.Admin(t)

	// Through the 2.4 guard: INFO with no argument is a 2.4 command.
	rc := sentinel.NewRoleChecker(configured.Pool(t), 200*time.Millisecond)
	if err := rc.CheckWritable(ctx); err != nil {
		t.Fatalf("a master: %v", err)
	}

	if _, err := admin.Do("SLAVEOF", "127.0.0.1", port); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "writes refused on the replica", func() bool {
		return errors.Is(rc.CheckWritable(ctx), sentinel.ErrNotMaster)
	})
	if role, err := rc.Role(ctx); err != nil || role != sentinel.RoleSlave {
		t.Fatalf("Role of a replica = %q, %v", role, err)
	}
	// Still refused while it stays a replica, whatever the cache holds.
	for range 3 {
		if err := rc.CheckWritable(ctx); !errors.Is(err, sentinel.ErrNotMaster) {
			t.Fatalf("CheckWritable on a replica: %v, want ErrNotMaster", err)
		}
	}

	promoted := time.Now()
	if _, err := admin.Do("SLAVEOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "writes allowed after SLAVEOF NO ONE", func() bool { return rc.CheckWritable(ctx) == nil })
	t.Logf("writes allowed %v after SLAVEOF NO ONE (MaxAge 200ms)", time.Since(promoted).Round(time.Millisecond))
	redistest.RequireNoViolations(t, configured)
}

// fakeSentinel answers SENTINEL get-master-addr-by-name with *addr.
func fakeSentinel(t *testing.T, addr *atomic.Value) string {
	m := miniredis.RunT(t)
	err := m.Server().Register("SENTINEL", func(c *server.Peer, cmd string, args []string) {
		host, port, _ := net.SplitHostPort(addr.Load().(string))
		c.WriteLen(2)
		c.WriteBulk(host)
		c.WriteBulk(port)
	})
	if err != nil {
		t.Fatal(err)
	}
	return m.Addr()
}

func TestSentinelDiscoverRefusesReplica(t *testing.T) {
	t.Parallel()
	// Servers of the test's own: one becomes a replica (SLAVEOF), and both
	// refuse ROLE (the 2.4 ACL), which a shared server may not.
	master := redistest.Start(t, redistest.Private())
	replica := redistest.Start(t, redistest.Private())
	_, port, _ := net.SplitHostPort(master.Addr)
	if _, err := replica.Admin(t).Do("SLAVEOF", "127.0.0.1", port); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var named atomic.Value
	named.Store(replica.Addr)
	c, err := sentinel.New(sentinel.Options{Sentinels: []string{fakeSentinel(t, &named)}, MasterName: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// These servers refuse ROLE (their ACL is the 2.4 table), so this also
	// covers the INFO replication fallback.
	if _, err := c.Discover(ctx); !errors.Is(err, sentinel.ErrNoMaster) || !errors.Is(err, sentinel.ErrNotMaster) {
		t.Fatalf("Discover of a replica: %v, want ErrNoMaster wrapping ErrNotMaster", err)
	}
	if _, err := c.Get(ctx); !errors.Is(err, sentinel.ErrNoMaster) {
		t.Fatalf("Get with only a replica named: %v, want ErrNoMaster", err)
	}
	named.Store(master.Addr)
	conn, err := c.Get(ctx)
	if err != nil {
		t.Fatalf("Get with the master named: %v", err)
	}
	conn.Close()
}

func TestSentinelFollowsFailover(t *testing.T) {
	t.Parallel()
	set := redistest.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, err := sentinel.New(sentinel.Options{Sentinels: set.SentinelAddrs(), MasterName: set.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.Master(ctx); err != nil || got != set.Master.Addr {
		t.Fatalf("Master = %s, %v; want %s", got, err, set.Master.Addr)
	}

	runCtx, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	runErr := make(chan error, 1)
	go func() { defer wg.Done(); runErr <- c.Run(runCtx) }()

	// A writer appends 1, 2, 3, ... to a list; every acknowledged value is
	// recorded.
	var (
		mu      sync.Mutex
		acked   []int
		failed  int
		okCount atomic.Int64
	)
	go func() {
		defer wg.Done()
		for i := 1; runCtx.Err() == nil; i++ {
			err := func() error {
				wctx, cancel := context.WithTimeout(runCtx, 2*time.Second)
				defer cancel()
				conn, err := c.Get(wctx)
				if err != nil {
					return err
				}
				defer conn.Close()
				_, err = redis.DoContext(conn, wctx, "RPUSH", "{failover}:list", i)
				return err
			}()
			mu.Lock()
			if err == nil {
				acked = append(acked, i)
				okCount.Add(1)
			} else {
				failed++
			}
			mu.Unlock()
			if err != nil {
				// real time: a producer that failed backs off a little,
				// as a real one would, instead of spinning.
				select {
				case <-runCtx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}()
	testwait.Until(t, 10*time.Second, "writes to the first master", func() bool { return okCount.Load() >= 100 })

	killed := time.Now()
	set.Master.Kill(t)
	testwait.Until(t, 30*time.Second, "the client on the promoted replica", func() bool {
		got, err := c.Master(ctx)
		return err == nil && got == set.Replica.Addr
	})
	switched := time.Since(killed)
	before := okCount.Load()
	testwait.Until(t, 10*time.Second, "writes to the new master", func() bool { return okCount.Load() > before+100 })
	stopRun()
	wg.Wait()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	if c.Switches() < 1 {
		t.Errorf("Switches = %d after a failover", c.Switches())
	}

	got, err := redis.Ints(set.Replica.TryDo("LRANGE", "{failover}:list", 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	present := make(map[int]int, len(got))
	for _, v := range got {
		present[v]++
		if present[v] > 1 {
			t.Fatalf("value %d written twice", v)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var lost []int
	for _, v := range acked {
		if present[v] == 0 {
			lost = append(lost, v)
		}
	}
	// Replication is asynchronous: what the old master acknowledged but had
	// not sent to the replica when it died is lost. Report how much.
	t.Logf("failover: client on the new master %v after the kill; %d writes acknowledged, %d lost %v, %d failed during it",
		switched.Round(time.Millisecond), len(acked), len(lost), lost, failed)
}
