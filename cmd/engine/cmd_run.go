package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/spf13/cobra"
)

// forcedWait bounds the wait for the server after the second signal: it
// only has to return the running tasks (one transaction) and unregister.
const forcedWait = 20 * time.Second

func (a *app) newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "run the dispatcher, reaper and workers (per config and --roles)",
		Long: `Runs the long-lived process: a dispatcher (moves due tasks to their
queues), a reaper (returns the tasks of dead workers) and workers (run
tasks with the commands configured under "handlers"). Run as many
processes as you like against one Redis and namespace; --roles (or the
--no-* flags) picks the parts one process runs.

A handler command gets the payload on stdin and ENGINE_TASK_ID, _TYPE,
_QUEUE, _ATTEMPT, _MAX_ATTEMPTS, _RECOVERIES, _DUE and _LAST_ERROR in its
environment, besides engine's own environment without the variables
that hold Redis credentials or say where they are (ENGINE_REDIS_*,
ENGINE_CONFIG, REDISCLI_AUTH, the HTTP token). Exit 0 is success, 75 snoozes
the task (runs it again after the handler's snooze, or after the duration
on stdout's last line "snooze 90s", without using an attempt), anything else is a failure (retried with backoff, then dead-lettered).

SIGINT or SIGTERM stops taking tasks and lets running ones finish for
shutdown_timeout, then returns the rest to their queues. A second signal
returns them at once; a third exits without returning them (a reaper
recovers them once this worker's heartbeat expires). SIGHUP reads the
configuration again and writes the flow control of the queues it lists
(max_running, rate, key_max_running, key_rate).`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd,
		[3]string{"concurrency", "concurrency", "`N` handlers at once"},
		[3]string{"queues", "queues", "queues to serve with weights, e.g. critical:6,default:3,low:1"},
		[3]string{"roles", "roles", "parts to run: some of dispatcher,reaper,worker"},
		[3]string{"log-format", "log.format", "log `format`: text or json"},
		[3]string{"shutdown-timeout", "shutdown_timeout", "how long running tasks may finish on SIGTERM, e.g. 30s"},
		[3]string{"http", "http.addr", "serve /healthz, /readyz and the dashboard on `host:port` (off by default)"},
		[3]string{"http-read-token-file", "http.read_token_file", "`file` holding the read token, needed to see the dashboard and /metrics"})
	off := map[string]*bool{}
	for _, r := range allRoles {
		off[r] = cmd.Flags().Bool("no-"+r, false, "run no "+r+": take role "+r+" out")
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		set, warnings, err := c.load(a, cmd)
		if err != nil {
			return a.fail("run", err)
		}
		set.Roles = slices.DeleteFunc(set.Roles, func(r string) bool { return *off[r] })
		if len(set.Roles) == 0 {
			return a.usageError(cmd, "every role is off (roles %s minus the --no-* flags)", set.where("roles"))
		}
		reload := func() (*Settings, error) {
			set, _, err := c.load(a, cmd)
			return set, err
		}
		return a.run(cmd.Context(), set, warnings, reload)
	}
	return cmd
}

// run serves set until ctx ends. reload, when not nil, reads the
// configuration again on SIGHUP: the queues' flow control it names is
// written to Redis (reloadLimits); every other setting needs a restart.
func (a *app) run(ctx context.Context, set *Settings, warnings []string, reload func() (*Settings, error)) error {
	log := newLogger(a.stderr, set)
	eng := set.engineConfig(log)
	for _, w := range warnings {
		log.Warn(w)
	}
	// One pool, or with shards one per server of the shard map.
	pools, closePools, err := lanePools(set, set.poolSize())
	if err != nil {
		return a.fail("run", err)
	}
	defer closePools()

	var state runState
	if set.HTTP.Addr != "" {
		// The dashboard and the gauges of /metrics read through pools of
		// their own: however many pages are asked for, the workers keep
		// theirs. They span every lane; /readyz pings lane 0's server.
		dashPools, closeDash, err := lanePools(set, dashboardPoolSize)
		if err != nil {
			return a.fail("run", err)
		}
		defer closeDash()
		if a.testPools != nil {
			a.testPools(pools[0], dashPools[0])
		}
		in, err := engine.NewInspector(eng, dashPools...)
		if err != nil {
			return a.fail("run", err)
		}
		// The collector observes this process's engine (eng.Observer,
		// before NewServer) and reads the queue gauges at scrape time.
		mh := metricsHandler(in, &eng)
		h, err := a.newHTTP(set, pools[0], log, state.ready, mh, in)
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
		// Served until the engine has stopped, so that /readyz reports
		// the shutdown.
		defer func() { stopHTTP(); <-httpDone }()
	}

	types := make([]string, 0, len(set.Handlers))
	for t := range set.Handlers {
		types = append(types, t)
	}
	sort.Strings(types)
	log.Info("engine starting", "version", versionString(), "redis", set.Redis.Addr, "namespace", eng.Namespace,
		"roles", strings.Join(set.Roles, ","), "queues", queueList(eng.Queues), "concurrency", eng.Concurrency, "handlers", types)
	// With shards, each lane waits for its own server instead, without
	// holding up the others.
	if !set.sharded() {
		if err := waitForRedis(ctx, pools[0], set.Redis.Addr, log); err != nil {
			if ctx.Err() != nil {
				log.Info("interrupted while waiting for Redis")
				return nil
			}
			return a.fail("run", err)
		}
	}

	roles := set.roles()
	var handler engine.Handler
	if roles.Has(engine.RoleWorker) {
		mux := engine.NewMux()
		if set.Log.Level == "debug" {
			mux.Use(logRuns(log))
		}
		hlog := log.With("component", "handler")
		for _, t := range types {
			h := set.Handlers[t]
			if _, err := exec.LookPath(h.Command[0]); err != nil && h.Dir == "" {
				log.Warn("handler command not found; its tasks will fail until it is installed", "type", t, "err", err)
			}
			ch := newCommandHandler(t, h, a.environ, hlog)
			ch.maxResult = eng.MaxResult
			mux.Handle(t, ch)
		}
		if !slices.ContainsFunc(eng.Queues, func(q engine.QueueConfig) bool { return q.Name == eng.DefaultQueue }) {
			log.Warn("this worker does not serve default_queue: tasks enqueued without --queue wait for another worker",
				"default_queue", eng.DefaultQueue, "queues", queueList(eng.Queues))
		}
		if len(types) == 0 {
			log.Warn("no handlers configured: this worker gives every task back for a worker that serves its type; a type no live worker serves for unknown_type_grace meets unknown_type")
		}
		handler = mux
	}
	srv, err := engine.NewServer(eng, handler, roles, pools...)
	if err != nil {
		return a.fail("run", err)
	}
	if reload != nil {
		in, err := engine.NewInspector(eng, pools...)
		if err != nil {
			return a.fail("run", err)
		}
		stop := reloadLimits(reload, in, log)
		defer stop()
	}
	if err := addPeriodics(srv, set); err != nil {
		return a.fail("run", err)
	}
	if set.sharded() {
		log.Info("serving lanes", "lanes", len(pools), "servers", strings.Join(slices.Compact(slices.Sorted(slices.Values(set.Shards.Lanes))), ","),
			"map_version", set.Shards.Version)
	}
	timeout := eng.ShutdownTimeout
	if timeout == 0 {
		timeout = engine.DefaultConfig().ShutdownTimeout
	}
	return serve(ctx, srv, timeout, log, &state)
}

// runState is what /readyz reports of this process's components: ready
// while the server runs and no shutdown has begun.
type runState struct {
	running, stopping atomic.Bool
}

func (s *runState) ready(context.Context) error {
	switch {
	case s.stopping.Load():
		return errors.New("shutting down")
	case !s.running.Load():
		return errors.New("not running (starting, or waiting for Redis)")
	}
	return nil
}

// serve runs srv until the first signal (ctx), then shuts it down with
// timeout for running handlers; the second signal (forceOf(ctx)) cuts
// that short: running tasks go back to their queues at once. state (may
// be nil) follows the server for /readyz.
func serve(ctx context.Context, srv *engine.Server, timeout time.Duration, log *slog.Logger, state *runState) error {
	if state == nil {
		state = &runState{}
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	done := make(chan struct{})
	go func() {
		defer close(done)
		state.running.Store(true)
		defer state.running.Store(false)
		_ = srv.Run(runCtx)
	}()
	select {
	case <-done:
		log.Error("server stopped on its own")
		return exitCode(exitFailure)
	case <-ctx.Done():
	}
	state.stopping.Store(true)
	log.Info("shutting down: running tasks may finish; signal again to return them to their queues now",
		"shutdown_timeout", timeout)
	stopCtx, cancelStop := context.WithTimeout(context.Background(), timeout)
	defer cancelStop()
	go func() {
		// Shutdown returns at once if Run has not started yet; ending
		// runCtx then stops it as soon as it does.
		_ = srv.Shutdown(stopCtx)
		stopRun()
	}()
	select {
	case <-done:
		log.Info("stopped")
		return nil
	case <-forceOf(ctx).Done():
	}
	log.Warn("second signal: returning unfinished tasks to their queues now")
	cancelStop()
	now, cancel := context.WithCancel(context.Background())
	cancel()
	go func() { _ = srv.Shutdown(now) }()
	select {
	case <-done:
		log.Info("stopped")
		return nil
	case <-time.After(forcedWait):
		log.Error("server did not stop; exiting anyway (a reaper will recover its tasks)")
		return exitCode(exitFailure)
	}
}

func queueList(qs []engine.QueueConfig) string {
	parts := make([]string, len(qs))
	for i, q := range qs {
		parts[i] = fmt.Sprintf("%s:%d", q.Name, q.Weight)
	}
	return strings.Join(parts, ",")
}

// reloadLimits writes, on every SIGHUP until stop is called, the flow
// control of each queue the configuration (read again by reload) lists:
// its max_running, rate, key_max_running and key_rate, a limit left out
// removed (Inspector.SetQueueLimits). A configuration that does not load
// changes nothing and is logged. Workers apply the limits within a
// second.
func reloadLimits(reload func() (*Settings, error), in *engine.Inspector, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
			}
			set, err := reload()
			if err != nil {
				log.Error("SIGHUP: the configuration did not load; limits unchanged", "err", err)
				continue
			}
			for _, q := range set.Engine.Queues {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := in.SetQueueLimits(ctx, q)
				cancel()
				if err != nil {
					log.Error("SIGHUP: could not set the queue's limits", "queue", q.Name, "err", err)
					continue
				}
				log.Info("SIGHUP: queue limits set", "queue", q.Name, "max_running", q.MaxRunning, "rate", q.Rate,
					"key_max_running", q.KeyMaxRunning, "key_rate", q.KeyRate)
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}
