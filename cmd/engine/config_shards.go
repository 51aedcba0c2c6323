package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"

	"github.com/bucketq/bucketq/engine"
	"github.com/gomodule/redigo/redis"
	"github.com/spf13/cobra"
)

// ShardSettings is the shards: section, the shard map: the namespace's
// lanes (logical shards) and the server each lives on. Empty Lanes: one
// lane on redis.addr, as without sharding.
type ShardSettings struct {
	// Version is the shard map's version (shards.version), raised by one
	// each time a lane moves to another server; 0 turns the map check
	// off (docs/scaling.md).
	Version int
	// Lanes lists, for lane k, the host:port of its server
	// (shards.lanes[k]); lanes of one server share its connections. The
	// other redis.* settings (password, TLS, timeouts) apply to each.
	Lanes []string
}

func init() {
	settings = append(settings,
		setting{"shards.lanes", func(s *Settings) any { return &s.Shards.Lanes }},
		setting{"shards.version", func(s *Settings) any { return &s.Shards.Version }},
	)
	slices.SortFunc(settings, func(a, b setting) int { return strings.Compare(a.key, b.key) })
}

// sharded reports whether the settings list lanes.
func (s *Settings) sharded() bool { return len(s.Shards.Lanes) > 0 }

// validateShards checks the shards: section.
func (s *Settings) validateShards(bad func(key, format string, args ...any)) {
	if len(s.Shards.Lanes) == 0 {
		s.Shards.Lanes = nil // "lanes: []" is the default
	}
	if s.Shards.Version < 0 {
		bad("shards.version", "%d: want 1 or more, or 0 for no map check", s.Shards.Version)
	}
	if len(s.Shards.Lanes) > 4096 {
		bad("shards.lanes", "%d lanes: want at most 4096", len(s.Shards.Lanes))
	}
	for i, addr := range s.Shards.Lanes {
		if _, _, err := net.SplitHostPort(addr); err != nil || addr == "" {
			bad(fmt.Sprintf("shards.lanes[%d]", i), "%s: want host:port", showAddr(addr))
		}
	}
	if s.sharded() && s.Redis.Mode != "" && s.Redis.Mode != modeSingle {
		bad("shards.lanes", "with redis.mode %s: the daemon's shard map lists single servers (mode single); a library user can give engine.Shards one topology pool per lane", s.Redis.Mode)
	}
	if s.sharded() && len(s.Redis.Replicas) > 0 {
		bad("shards.lanes", "with redis.replicas: the replica list names one server's replicas, not each lane's; a library user can give engine.Shards one topology.Replicated pool per lane")
	}
	if s.Shards.Version > 0 && !s.sharded() {
		bad("shards.version", "%d without shards.lanes: list the lanes' servers", s.Shards.Version)
	}
}

// shardPools opens one pool per distinct server of the shard map and
// returns the placement (lanes of one server share its pool) and a
// function that closes the pools. A server's pool holds poolSize
// connections for each lane it carries: every lane runs its own worker of
// concurrency handler slots, each holding a connection while its task
// runs, and its own dispatcher, reaper and heartbeat, so a pool sized for
// one lane would make the lanes' heartbeats wait behind their handlers.
func shardPools(set *Settings) (engine.Shards, func(), error) {
	return shardPoolsOf(set, set.poolSize())
}

// shardPoolsOf is shardPools with size connections per lane.
func shardPoolsOf(set *Settings, size int) (engine.Shards, func(), error) {
	sh := engine.Shards{MapVersion: int64(set.Shards.Version)}
	byAddr := map[string]*redis.Pool{}
	lanesOn := map[string]int{}
	for _, addr := range set.Shards.Lanes {
		lanesOn[addr]++
	}
	closeAll := func() {
		for _, p := range byAddr {
			closePool(p)
		}
	}
	for _, addr := range set.Shards.Lanes {
		p := byAddr[addr]
		if p == nil {
			rs := set.redisSettings()
			rs.Addr = addr
			var err error
			if p, err = newPool(rs, lanesOn[addr]*size, nil); err != nil {
				closeAll()
				return sh, nil, err
			}
			byAddr[addr] = p
		}
		sh.Pools = append(sh.Pools, p)
	}
	return sh, closeAll, nil
}

// connectShards is connect for a sharded configuration: the session's
// client and pool are lane 0's, shards spans every lane. Every command
// that connects spans the lanes through the session's methods below (or
// reads lane 0 where that lane alone holds what it shows: the periodic
// entries).
func (a *app) connectShards(cmd *cobra.Command, set *Settings, log *slog.Logger) (*session, error) {
	sh, closeAll, err := shardPools(set)
	if err != nil {
		return nil, a.fail(cmd.Name(), err)
	}
	sc, err := engine.NewShardedClient(sh, set.engineConfig(log))
	if err != nil {
		closeAll()
		return nil, a.fail(cmd.Name(), err)
	}
	return &session{set: set, log: log, pool: sh.Pools[0], client: sc.Lane(0), shards: sc, closeShards: closeAll}, nil
}

// runSharded is `engine run` over the lanes of the shard map.
func (a *app) runSharded(ctx context.Context, set *Settings, log *slog.Logger, eng engine.Config, handler engine.Handler, roles engine.Roles) error {
	sh, closeAll, err := shardPools(set)
	if err != nil {
		return a.fail("run", err)
	}
	defer closeAll()
	var state runState
	if set.HTTP.Addr != "" {
		// The dashboard, /metrics and the health endpoints span every
		// lane (/healthz pings lane 0's server). The dashboard and the
		// gauges read through pools of their own, as in run.
		dsh, closeDash, err := shardPoolsOf(set, dashboardPoolSize)
		if err != nil {
			return a.fail("run", err)
		}
		defer closeDash()
		if a.testPools != nil {
			a.testPools(sh.Pools[0], dsh.Pools[0])
		}
		sc, err := engine.NewShardedClient(dsh, eng)
		if err != nil {
			return a.fail("run", err)
		}
		mh := shardedMetrics(sc, &eng)
		h, err := a.newHTTP(set, sh.Pools[0], dsh.Pools[0], log, state.ready, mh, sc.Inspector())
		if err != nil {
			return a.fail("run", err)
		}
		httpCtx, stopHTTP := context.WithCancel(context.Background())
		httpDone := make(chan struct{})
		go func() {
			defer close(httpDone)
			if err := h.serve(httpCtx); err != nil {
				log.Error("HTTP server stopped", "err", err)
			}
		}()
		defer func() { stopHTTP(); <-httpDone }()
	}
	srv, err := engine.NewShardedServer(sh, eng, handler, roles)
	if err != nil {
		return a.fail("run", err)
	}
	if len(set.Periodic) > 0 {
		if err := addPeriodics(srv.Lanes[0], set); err != nil {
			return a.fail("run", err)
		}
	}
	log.Info("serving lanes", "lanes", len(sh.Pools), "servers", strings.Join(slices.Compact(slices.Sorted(slices.Values(set.Shards.Lanes))), ","),
		"map_version", set.Shards.Version)
	timeout := eng.ShutdownTimeout
	if timeout == 0 {
		timeout = engine.DefaultConfig().ShutdownTimeout
	}
	return serve(ctx, srv, timeout, log, &state)
}

// waitForRedisUnlessSharded is waitForRedis on redis.addr, or nothing
// with shards configured.
func waitForRedisUnlessSharded(ctx context.Context, set *Settings, pool *redis.Pool, log *slog.Logger) error {
	if set.sharded() {
		return nil
	}
	return waitForRedis(ctx, pool, set.Redis.Addr, log)
}

// runShardedCheck is runCheck on every lane of s.shards in turn, each
// lane's report under a heading (with --json, one object per lane, one
// per line); c is unused. It returns the findings of every lane; a lane
// that cannot be checked is reported and fails the whole.
func (s *session) runShardedCheck(ctx context.Context, _ *engine.Client, repair, asJSON bool, out io.Writer) (int, error) {
	total := 0
	var errs []error
	for k := range s.shards.Lanes() {
		if !asJSON {
			fmt.Fprintf(out, "lane %d (%s):\n", k, s.set.Shards.Lanes[k])
		}
		var buf bytes.Buffer
		n, err := runCheck(ctx, s.shards.Lane(k), repair, asJSON, &buf)
		if asJSON {
			// One line per lane.
			var v any
			if json.Unmarshal(buf.Bytes(), &v) == nil {
				b, _ := json.Marshal(map[string]any{"lane": k, "report": v})
				fmt.Fprintf(out, "%s\n", b)
			}
		} else {
			out.Write(buf.Bytes())
		}
		total += n
		if err != nil {
			if !asJSON {
				fmt.Fprintf(out, "lane %d: %v\n", k, err)
			}
			errs = append(errs, fmt.Errorf("lane %d: %w", k, err))
		}
	}
	return total, errors.Join(errs...)
}

// enqueue enqueues with the sharded client when the settings list shards
// (the task goes to its lane, see engine.ShardedClient), else with the
// client.
func (s *session) enqueue(ctx context.Context, typ string, payload []byte, opts ...engine.Option) (*engine.TaskInfo, error) {
	if s.shards != nil {
		return s.shards.Enqueue(ctx, typ, payload, opts...)
	}
	return s.client.Enqueue(ctx, typ, payload, opts...)
}

// clientFor is the client of task id's lane: the client itself without
// shards.
func (s *session) clientFor(id string) *engine.Client {
	if s.shards != nil {
		return s.shards.Lane(s.shards.LaneOf(id))
	}
	return s.client
}

// tasksAPI is what the commands ask of a client: *engine.Client, or with
// shards *engine.ShardedClient, which routes each call by id to the id's
// lane (looking in the others for an id its lane does not hold) and
// spans the lanes for the others.
type tasksAPI interface {
	Cancel(ctx context.Context, id string) error
	Lookup(ctx context.Context, id string) (*engine.TaskInfo, error)
	Result(ctx context.Context, id string) ([]byte, error)
	RetryDead(ctx context.Context, id string) error
	PurgeDead(ctx context.Context, id string) error
	RetryAllDead(ctx context.Context) (int, error)
	PurgeAllDead(ctx context.Context) (int, error)
	DeadLetters(ctx context.Context, offset, count int) ([]*engine.TaskInfo, error)
	DeadCount(ctx context.Context) (int, error)
	PauseQueue(ctx context.Context, q string) error
	ResumeQueue(ctx context.Context, q string) error
	CancelWorkflow(ctx context.Context, id string) (int, error)
	EnqueueChain(ctx context.Context, id string, steps ...engine.Step) (*engine.WorkflowInfo, error)
	EnqueueGroup(ctx context.Context, g engine.Group) (*engine.WorkflowInfo, error)
}

// tasks is the session's tasksAPI: the sharded client with shards.
func (s *session) tasks() tasksAPI {
	if s.shards != nil {
		return s.shards
	}
	return s.client
}

// inspectorAPI is what the inspector's commands ask: *engine.Inspector,
// or with shards *engine.ShardedInspector (calls by id go to the id's
// lane, lists and counts span the lanes).
type inspectorAPI interface {
	ListTasks(ctx context.Context, opts engine.ListOptions) (*engine.TaskPage, error)
	Act(ctx context.Context, a engine.Action, ids ...string) (engine.ActionResult, error)
	ActAll(ctx context.Context, a engine.Action, f engine.Filter) (engine.ActionResult, error)
	Workers(ctx context.Context) ([]engine.WorkerInfo, error)
	Queues(ctx context.Context) ([]engine.QueueInfo, error)
	Workflow(ctx context.Context, id string) (*engine.WorkflowInfo, error)
}

// inspector is the session's inspectorAPI.
func (s *session) inspector() inspectorAPI {
	if s.shards != nil {
		return s.shards.Inspector()
	}
	return s.client.Inspector()
}
