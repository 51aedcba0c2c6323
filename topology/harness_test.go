package topology_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/measured"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envLong makes the failover tests run their load longer (see
// docs/scaling.md): the value is a duration, such as "30s".
const envLong = "TOPOLOGY_TEST_LONG"

// loadAcks is how many more enqueues the producers get acknowledged
// around each disruption: enough writes in flight to lose some if the
// engine could.
const loadAcks = 100

// longFor is how long TOPOLOGY_TEST_LONG asks the producers to run
// around each disruption; 0 when unset.
func longFor(t *testing.T) time.Duration {
	v := os.Getenv(envLong)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", envLong, v, err)
	}
	return d
}

// keep lets the producers run on until n more enqueues were acknowledged
// and, with TOPOLOGY_TEST_LONG, for part (1: all) of that duration too.
func (l *load) keep(n int, part float64) {
	l.t.Helper()
	l.waitAcked(n, outcomeWait)
	if d := time.Duration(float64(longFor(l.t)) * part); d > 0 {
		// real time: TOPOLOGY_TEST_LONG asks for load of that duration.
		time.Sleep(d)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("TOPOLOGY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func engineConfig(t testing.TB, ns string) engine.Config {
	return engine.Config{Namespace: ns, Logger: testLogger(t), ShutdownTimeout: 5 * time.Second, RetryDelay: func(*engine.Task, int, error) time.Duration { return 10 * time.Millisecond }, Advanced: engine.AdvancedConfig{IdleWait: time.Second, HeartbeatInterval: 250 * time.Millisecond, HeartbeatTTL: 3 * time.Second, ReapInterval: 200 * time.Millisecond}}
}

// guardedDial dials addr with every command held to the Redis 2.4 table
// and counted in census: the engine's connections must send nothing else
// in any mode.
func guardedDial(t testing.TB, census *redis24.Census) func(context.Context, string) (redis.Conn, error) {
	return func(ctx context.Context, addr string) (redis.Conn, error) {
		c, err := redis.DialContext(ctx, "tcp", addr, redis.DialConnectTimeout(time.Second),
			redis.DialReadTimeout(10*time.Second), redis.DialWriteTimeout(5*time.Second))
		if err != nil {
			return nil, err
		}
		return redis24.Wrap(c, redis24.WithCensus(census), redis24.OnViolation(func(v *redis24.Violation) {
			t.Errorf("engine connection sent a command outside Redis 2.4: %v", v)
		})), nil
	}
}

// load is an engine server and producers on one pool, with the ledger of
// what was acknowledged and what ran.
type load struct {
	t      *testing.T
	client *engine.Client

	mu       sync.Mutex
	acked    map[string]bool      // Enqueue returned nil
	ackedAt  map[string]time.Time // when
	ran      map[string]int       // handler runs per task
	failures map[string]int       // Enqueue errors, by kind
	samples  map[string]string
	failed   atomic.Int64
	changed  testwait.Pulse // an enqueue acknowledged, a task run

	stopServer func()
	stopProd   func()
}

// startLoad starts an engine.Server with every role and producers
// enqueueing tasks (half due now, half within a second) until stopProducers.
func startLoad(t *testing.T, pool *redis.Pool, ns string, producers int) *load {
	t.Helper()
	cfg := engineConfig(t, ns)
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	l := &load{t: t, client: client, acked: map[string]bool{}, ackedAt: map[string]time.Time{}, ran: map[string]int{}, failures: map[string]int{}, samples: map[string]string{}}
	mux := engine.NewMux()
	mux.HandleFunc("job", func(ctx context.Context, task *engine.Task) error {
		l.mu.Lock()
		l.ran[task.ID]++
		l.mu.Unlock()
		l.changed.Beat()
		return nil
	})
	srv, err := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() {
		defer close(sdone)
		if err := srv.Run(sctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("server: %v", err)
		}
	}()
	l.stopServer = sync.OnceFunc(func() { scancel(); <-sdone })
	t.Cleanup(l.stopServer)

	pctx, pcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pctx.Err() == nil; i++ {
				ctx, cancel := context.WithTimeout(pctx, 10*time.Second)
				var info *engine.TaskInfo
				var err error
				if (i+p)%2 == 0 {
					info, err = client.Enqueue(ctx, "job", nil)
				} else {
					info, err = client.Enqueue(ctx, "job", nil, engine.In(time.Duration(i%10)*100*time.Millisecond))
				}
				cancel()
				if err != nil {
					if pctx.Err() != nil {
						return
					}
					l.failed.Add(1)
					l.mu.Lock()
					l.failures[errorKind(err)]++
					if _, ok := l.samples[errorKind(err)]; !ok {
						l.samples[errorKind(err)] = err.Error()
					}
					l.mu.Unlock()
					// real time: a producer that failed backs off a
					// little, as a real one would, instead of spinning.
					time.Sleep(20 * time.Millisecond)
					continue
				}
				l.mu.Lock()
				l.acked[info.ID] = true
				l.ackedAt[info.ID] = time.Now()
				l.mu.Unlock()
				l.changed.Beat()
			}
		}()
	}
	l.stopProd = sync.OnceFunc(func() { pcancel(); wg.Wait() })
	t.Cleanup(l.stopProd)
	return l
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, engine.ErrUncertain):
		return "uncertain"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	default:
		return "other"
	}
}

// ackedCount is how many enqueues were acknowledged so far.
func (l *load) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// waitAcked waits until n more enqueues than now were acknowledged: the
// engine is taking writes.
func (l *load) waitAcked(n int, timeout time.Duration) {
	l.t.Helper()
	want := l.ackedCount() + n
	deadline := time.After(timeout)
	for {
		next := l.changed.Wait()
		if l.ackedCount() >= want {
			return
		}
		select {
		case <-next:
		case <-deadline:
			l.t.Fatalf("fewer than %d enqueues acknowledged within %v (failures so far: %v)", n, timeout, l.failureKinds())
		}
	}
}

func (l *load) failureKinds() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.failures {
		out[k] = v
	}
	return out
}

// settle stops the producers, waits until every acknowledged task ran or
// timeout passed, and returns the acknowledged tasks that never ran, and
// the count of tasks that ran more than once.
func (l *load) settle(timeout time.Duration) (lost []string, dups int) {
	l.t.Helper()
	l.stopProd()
	deadline := time.After(timeout)
	for {
		next := l.changed.Wait()
		l.mu.Lock()
		lost = lost[:0]
		for id := range l.acked {
			if l.ran[id] == 0 {
				lost = append(lost, id)
			}
		}
		dups = 0
		for _, n := range l.ran {
			if n > 1 {
				dups++
			}
		}
		l.mu.Unlock()
		if len(lost) == 0 {
			return lost, dups
		}
		select {
		case <-next:
		case <-deadline:
			return lost, dups
		}
	}
}

// report logs the ledger and, when a server was killed at killed, how
// long before the kill each lost task had been acknowledged.
func (l *load) report(what string, lost []string, dups int, killed time.Time) {
	l.t.Helper()
	l.mu.Lock()
	acked, ran := len(l.acked), len(l.ran)
	for _, id := range lost {
		if !killed.IsZero() {
			l.t.Logf("%s: lost task %s was acknowledged %v before the kill", what, id, killed.Sub(l.ackedAt[id]))
		}
	}
	l.mu.Unlock()
	kinds := l.failureKinds()
	l.t.Logf("%s: %d enqueues acknowledged, %d tasks ran, %d acknowledged and never ran (lost), %d ran twice or more, "+
		"%d enqueues failed %v %q", what, acked, ran, len(lost), dups, l.failed.Load(), kinds, l.samples)
	var names []string
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	var notes map[string]string
	if len(names) > 0 {
		notes = map[string]string{"failed with": strings.Join(names, ", ")}
	}
	if _, err := measured.Log("failover", "`"+l.t.Name()+"` ("+what+")", map[string]float64{
		"acknowledged": float64(acked), "ran": float64(ran), "lost": float64(len(lost)),
		"twice": float64(dups), "failed": float64(l.failed.Load()),
	}, notes); err != nil {
		l.t.Error(err)
	}
}

func splitAddr(t testing.TB, addr string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

func dbsize(t testing.TB, c redis.Conn) int {
	t.Helper()
	n, err := redis.Int(c.Do("DBSIZE"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
