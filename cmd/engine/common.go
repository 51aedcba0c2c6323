package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/gomodule/redigo/redis"
)

// common holds the flags every Redis command takes.
type common struct {
	fs     *flag.FlagSet
	config string
	flags  map[string]string // flag name → setting key, for overrides
}

// addCommon registers --config, --redis, --namespace and --log-level (and
// whatever extra setting flags the command asks for) on fs.
// Each extra is {flag name, setting key, usage}.
func addCommon(fs *flag.FlagSet, extra ...[3]string) *common {
	c := &common{fs: fs, flags: map[string]string{}}
	fs.StringVar(&c.config, "config", "", "config file (default $"+envConfig+"; built-in defaults without either)")
	c.setting("redis", "redis.addr", "Redis `host:port`")
	c.setting("namespace", "namespace", "key prefix shared by every process of one engine")
	c.setting("log-level", "log.level", "log `level`: debug, info, warn or error")
	for _, e := range extra {
		c.setting(e[0], e[1], e[2])
	}
	return c
}

// setting registers --name as an override of key.
func (c *common) setting(name, key, usage string) {
	if usage == "" {
		usage = "overrides " + key
	} else {
		usage += " (overrides " + key + ")"
	}
	c.fs.String(name, "", usage)
	c.flags[name] = key
}

// load reads the settings: defaults, the config file, ENGINE_* variables,
// then the flags that were given.
func (c *common) load(a *app) (*Settings, []string, error) {
	src := source{environ: a.environ}
	path := c.config
	if path == "" {
		path = lookupEnv(a.environ, envConfig)
	}
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, &ConfigError{Origin: "config", Msg: err.Error()}
		}
		defer f.Close()
		src.file, src.fileName = f, path
	}
	c.fs.Visit(func(f *flag.Flag) {
		if key, ok := c.flags[f.Name]; ok {
			src.overrides = append(src.overrides, override{key: key, value: f.Value.String(), origin: "flag --" + f.Name})
		}
	})
	return loadSettings(src)
}

func lookupEnv(environ []string, name string) string {
	v := ""
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	if err == nil && !strings.ContainsAny(s, "+-") {
		return l, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

// newLogger logs to w at the settings' level and format.
func newLogger(w io.Writer, s *Settings) *slog.Logger {
	level, _ := parseLevel(s.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// session is what a client command needs: settings, logger, pool, client.
type session struct {
	set    *Settings
	log    *slog.Logger
	pool   *redis.Pool
	client *engine.Client
}

func (s *session) close() { s.pool.Close() }

// connect loads the settings and opens a pool and a client. On failure it
// has printed the error and returns the exit code.
func (a *app) connect(cmd string, c *common) (*session, int) {
	set, warnings, err := c.load(a)
	if err != nil {
		return nil, a.fail(cmd, err)
	}
	log := newLogger(a.stderr, set)
	for _, w := range warnings {
		log.Warn(w)
	}
	pool, err := newPool(set.Redis, set.poolSize(), nil)
	if err != nil {
		return nil, a.fail(cmd, err)
	}
	// One PING first, so that a refused password or database, or a
	// server that wants a password, is told apart from other failures.
	ctx, cancel := context.WithTimeout(context.Background(), set.Redis.DialTimeout+max(set.Redis.ReadTimeout, 5*time.Second))
	defer cancel()
	if err := ping(ctx, pool, set.Redis.Addr); err != nil {
		pool.Close()
		var re *refusedError
		if !errors.As(err, &re) {
			err = fmt.Errorf("cannot reach Redis at %s: %w", set.Redis.Addr, err)
		}
		return nil, a.fail(cmd, err)
	}
	client, err := engine.NewClient(pool, set.EngineConfig(log))
	if err != nil {
		pool.Close()
		return nil, a.fail(cmd, err)
	}
	return &session{set: set, log: log, pool: pool, client: client}, 0
}
