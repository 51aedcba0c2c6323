package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// asynqImpl drives github.com/hibiken/asynq through its public API only:
// asynq.Client for enqueue/schedule and asynq.Server for workers and for the
// forwarder (asynq's mover of due tasks: a Lua script that moves up to 100
// tasks per call from the "scheduled" ZSET to the "pending" list, looping
// until none is due, every DelayedTaskCheckInterval).
//
// The queue name is the namespace, so every key is asynq:{<ns>}:...; asynq
// also adds the queue name to the global set asynq:queues (removed by
// Cleanup) and registers servers/workers under asynq:servers and
// asynq:workers (removed by asynq itself on Shutdown).
//
// Intervals: with Env.Poll > 0 both DelayedTaskCheckInterval (forwarder) and
// TaskCheckInterval (how long an idle worker sleeps before polling the
// pending list again) are set to it, so that all polling designs react
// equally fast; with Env.Poll == 0 asynq's defaults (5s and 1s) apply.
//
// Dispatch measurement (see Dispatcher): asynq's client puts a task whose
// ProcessAt is not in the future straight into pending, so a backlog of
// already-due scheduled tasks cannot be made through the client as such.
// SeedDue therefore schedules every task through asynq.Client with ProcessAt
// one day ahead (so the task hashes, state "scheduled", and ZSET members are
// written by asynq itself), then rebuilds the same members under a temporary
// key with the wanted past due times as scores (asynq's scores are unix
// seconds) and deletes the original ZSET. StartDispatchers starts n
// asynq.Servers and calls Stop on each at once, which stops their processors
// (no task is consumed) while their forwarders keep running; Release RENAMEs
// the temporary key to asynq:{<ns>}:scheduled, and ReadyCount is LLEN of
// asynq:{<ns>}:pending. So exactly asynq's own forwarder code is timed, with n
// servers' forwarders competing as n dispatchers. These two key names come
// from asynq's internal/base package (v0.26.0) and are checked in SeedDue.
type asynqImpl struct {
	rc     *redis.Client
	client *asynq.Client
	queue  string
	poll   time.Duration
	logf   func(string, ...any)
	tmpKey string
}

func init() { register("asynq", func() Impl { return &asynqImpl{} }) }

// asynqTaskType is the type name of every benchmark task.
const asynqTaskType = "bench"

// Name implements Impl.
func (a *asynqImpl) Name() string { return "asynq" }

func (a *asynqImpl) scheduledKey() string { return "asynq:{" + a.queue + "}:scheduled" }
func (a *asynqImpl) pendingKey() string   { return "asynq:{" + a.queue + "}:pending" }

// Open implements Impl. asynq needs Redis >= 4.
func (a *asynqImpl) Open(ctx context.Context, env Env) error {
	a.queue = env.Namespace
	a.tmpKey = "asynq:{" + a.queue + "}:bench-seed"
	a.poll = env.Poll
	a.logf = env.Logf
	a.rc = redis.NewClient(&redis.Options{Addr: env.Addr, PoolSize: 256})
	info, err := a.rc.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if v := infoField(info, "redis_version"); majorVersion(v) < 4 {
		return fmt.Errorf("asynq needs Redis >= 4, server is %s: %w", v, ErrUnsupported)
	}
	a.client = asynq.NewClientFromRedisClient(a.rc)
	return nil
}

// Close implements Impl.
func (a *asynqImpl) Close() error {
	if a.client != nil {
		_ = a.client.Close() // shared connection: does not close a.rc
	}
	if a.rc != nil {
		return a.rc.Close()
	}
	return nil
}

// KeyPatterns implements Impl.
func (a *asynqImpl) KeyPatterns() []string { return []string{"asynq:{" + a.queue + "}:*"} }

// Cleanup implements Cleaner.
func (a *asynqImpl) Cleanup(ctx context.Context) error {
	return a.rc.SRem(ctx, "asynq:queues", a.queue).Err()
}

func (a *asynqImpl) task(t Task) *asynq.Task { return asynq.NewTask(asynqTaskType, encodeTask(t)) }

// Enqueue implements Impl.
func (a *asynqImpl) Enqueue(ctx context.Context, t Task) error {
	_, err := a.client.EnqueueContext(ctx, a.task(t), asynq.Queue(a.queue))
	return err
}

// Schedule implements Scheduler (ProcessAt; not in the future = pending at once).
func (a *asynqImpl) Schedule(ctx context.Context, t Task) error {
	_, err := a.client.EnqueueContext(ctx, a.task(t), asynq.Queue(a.queue), asynq.ProcessAt(t.Due))
	return err
}

// config is the asynq.Server configuration used everywhere.
func (a *asynqImpl) config(concurrency int) asynq.Config {
	cfg := asynq.Config{
		Concurrency:     concurrency,
		Queues:          map[string]int{a.queue: 1},
		Logger:          asynqLogger{a.logf},
		LogLevel:        asynq.WarnLevel,
		ShutdownTimeout: 10 * time.Second,
	}
	if a.poll > 0 {
		cfg.DelayedTaskCheckInterval = a.poll
		cfg.TaskCheckInterval = a.poll
	}
	return cfg
}

// Consume implements Impl: one asynq.Server with cfg.Workers concurrency
// (its forwarder is the first dispatcher); each further dispatcher is one
// more server whose processor is stopped at once, leaving only its forwarder.
func (a *asynqImpl) Consume(ctx context.Context, cfg ConsumeConfig, h Handler) (func() error, error) {
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		d, err := decodeTask(t.Payload())
		if err != nil {
			return err
		}
		return h(ctx, d)
	})
	main := asynq.NewServerFromRedisClient(a.rc, a.config(max(cfg.Workers, 1)))
	if err := main.Start(handler); err != nil {
		return nil, err
	}
	servers := []*asynq.Server{main}
	stop := func() error {
		for _, s := range servers {
			s.Shutdown()
		}
		return nil
	}
	extra, err := a.forwarders(cfg.Dispatchers - 1)
	servers = append(servers, extra...)
	if err != nil {
		_ = stop()
		return nil, err
	}
	return stop, nil
}

// forwarders starts n servers whose processors are stopped at once.
func (a *asynqImpl) forwarders(n int) ([]*asynq.Server, error) {
	var out []*asynq.Server
	refuse := asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return fmt.Errorf("bench: forwarder-only asynq server got a task")
	})
	for range n {
		s := asynq.NewServerFromRedisClient(a.rc, a.config(1))
		if err := s.Start(refuse); err != nil {
			for _, o := range out {
				o.Shutdown()
			}
			return nil, err
		}
		s.Stop() // stops the processor only; the forwarder keeps running
		out = append(out, s)
	}
	return out, nil
}

// SeedDue implements Dispatcher (see the type's doc comment).
func (a *asynqImpl) SeedDue(ctx context.Context, ts []Task) error {
	ids := make([]string, len(ts))
	later := time.Now().Add(24 * time.Hour)
	err := parallel(ctx, len(ts), 8, func(i int) error {
		info, err := a.client.EnqueueContext(ctx, a.task(ts[i]), asynq.Queue(a.queue), asynq.ProcessAt(later))
		if err != nil {
			return err
		}
		ids[i] = info.ID
		return nil
	})
	if err != nil {
		return err
	}
	n, err := a.rc.ZCard(ctx, a.scheduledKey()).Result()
	if err != nil {
		return err
	}
	if n != int64(len(ts)) {
		return fmt.Errorf("asynq key layout changed? %s holds %d members, want %d", a.scheduledKey(), n, len(ts))
	}
	if err := a.rc.Del(ctx, a.tmpKey).Err(); err != nil {
		return err
	}
	const chunk = 1000
	pipe := a.rc.Pipeline()
	for i := 0; i < len(ts); i += chunk {
		j := min(i+chunk, len(ts))
		zs := make([]redis.Z, 0, j-i)
		for k := i; k < j; k++ {
			zs = append(zs, redis.Z{Score: float64(ts[k].Due.Unix()), Member: ids[k]})
		}
		pipe.ZAdd(ctx, a.tmpKey, zs...)
	}
	pipe.Del(ctx, a.scheduledKey())
	_, err = pipe.Exec(ctx)
	return err
}

// StartDispatchers implements Dispatcher: n forwarder-only servers.
func (a *asynqImpl) StartDispatchers(ctx context.Context, n int) (func() error, error) {
	servers, err := a.forwarders(n)
	if err != nil {
		return nil, err
	}
	return func() error {
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Add(1)
			go func() { defer wg.Done(); s.Shutdown() }()
		}
		wg.Wait()
		return nil
	}, nil
}

// Release implements Dispatcher.
func (a *asynqImpl) Release(ctx context.Context) error {
	return a.rc.Rename(ctx, a.tmpKey, a.scheduledKey()).Err()
}

// ReadyCount implements Dispatcher.
func (a *asynqImpl) ReadyCount(ctx context.Context) (int64, error) {
	return a.rc.LLen(ctx, a.pendingKey()).Result()
}

// asynqLogger forwards asynq's warnings and errors to the harness's stderr
// log and drops the rest.
type asynqLogger struct{ logf func(string, ...any) }

func (asynqLogger) Debug(...any)       {}
func (asynqLogger) Info(...any)        {}
func (l asynqLogger) Warn(args ...any) { l.logf("asynq: %s", strings.TrimSpace(fmt.Sprintln(args...))) }
func (l asynqLogger) Error(args ...any) {
	l.logf("asynq: ERROR %s", strings.TrimSpace(fmt.Sprintln(args...)))
}
func (l asynqLogger) Fatal(args ...any) {
	l.logf("asynq: FATAL %s", strings.TrimSpace(fmt.Sprintln(args...)))
}

// infoField returns one field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// majorVersion returns the major number of a "7.0.15"-style version.
func majorVersion(v string) int {
	maj, _, _ := strings.Cut(v, ".")
	n, _ := strconv.Atoi(maj)
	return n
}
