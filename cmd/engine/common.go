package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// common holds the flags every Redis command takes.
type common struct {
	config string
	flags  map[string]string // flag name → setting key, for overrides
}

// addCommon registers --config, --redis, --namespace and --log-level (and
// whatever extra setting flags the command asks for) on cmd. Each extra
// is {flag name, setting key, usage}.
func addCommon(cmd *cobra.Command, extra ...[3]string) *common {
	c := &common{flags: map[string]string{}}
	cmd.Flags().StringVar(&c.config, "config", "", "config file (default $"+envConfig+"; built-in defaults without either)")
	extra = append([][3]string{{"redis", "redis.addr", "Redis `host:port`"},
		{"namespace", "namespace", "key prefix shared by every process of one engine"},
		{"log-level", "log.level", "log `level`: debug, info, warn or error"}}, extra...)
	for _, e := range extra {
		cmd.Flags().String(e[0], "", e[2]+" (overrides "+e[1]+")")
		c.flags[e[0]] = e[1]
	}
	return c
}

// load reads the settings: defaults, the config file, ENGINE_* variables,
// then the flags that were given.
func (c *common) load(a *app, cmd *cobra.Command) (*Settings, []string, error) {
	src := source{environ: a.environ}
	path := c.config
	if path == "" {
		path, _ = lookupEnv(a.environ, envConfig)
	}
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, &ConfigError{Origin: "config", Msg: err.Error()}
		}
		defer f.Close()
		src.file, src.fileName = f, path
	}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if key, ok := c.flags[f.Name]; ok {
			src.overrides = append(src.overrides, override{key: key, value: f.Value.String(), origin: "flag --" + f.Name})
		}
	})
	return loadSettings(src)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	if err == nil && !strings.ContainsAny(s, "+-") {
		return l, nil
	}
	return 0, fmt.Errorf("unknown log level %s", safetext.Quote(s))
}

// newLogger logs to w at the settings' level and format.
func newLogger(w io.Writer, s *Settings) *slog.Logger {
	level, _ := parseLevel(s.Log.Level)
	opts := &slog.HandlerOptions{Level: level}
	if s.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// session is what a client command needs: settings, logger, and a client
// and an inspector that span every lane (the one lane on redis.addr
// without shards, one pool per lane of the shard map with them).
type session struct {
	set    *Settings
	log    *slog.Logger
	client *engine.Client
	in     *engine.Inspector
	close  func() // closes the pools
}

// connect loads the settings, opens the pools and makes the client and
// the inspector. On failure it has printed the error and returns the exit
// code.
func (a *app) connect(cmd *cobra.Command, c *common) (*session, error) {
	set, warnings, err := c.load(a, cmd)
	if err != nil {
		return nil, a.fail(cmd.Name(), err)
	}
	log := newLogger(a.stderr, set)
	for _, w := range warnings {
		log.Warn(w)
	}
	pools, closePools, err := lanePools(set, set.poolSize())
	if err != nil {
		return nil, a.fail(cmd.Name(), err)
	}
	// Without shards, one PING first, so that a refused password or
	// database, or a server that wants a password, is told apart from
	// other failures. With shards a lane that cannot be reached fails the
	// calls that need it, and `engine shards` shows it.
	if !set.sharded() {
		ctx, cancel := context.WithTimeout(context.Background(), set.Redis.DialTimeout+max(set.Redis.ReadTimeout, 5*time.Second))
		defer cancel()
		if err := ping(ctx, pools[0], set.Redis.Addr); err != nil {
			closePools()
			var re *refusedError
			if !errors.As(err, &re) {
				err = fmt.Errorf("cannot reach Redis at %s: %w", set.Redis.Addr, err)
				if set.Redis.TLS.Enabled && set.Redis.TLS.CertFile == "" {
					err = fmt.Errorf("%w\n(if the server checks client certificates, set redis.tls.cert_file and redis.tls.key_file)", err)
				}
			}
			return nil, a.fail(cmd.Name(), err)
		}
	}
	cfg := set.engineConfig(log)
	client, err := engine.NewClient(cfg, pools...)
	if err != nil {
		closePools()
		return nil, a.fail(cmd.Name(), err)
	}
	in, err := engine.NewInspector(cfg, pools...)
	if err != nil {
		closePools()
		return nil, a.fail(cmd.Name(), err)
	}
	return &session{set: set, log: log, client: client, in: in, close: closePools}, nil
}

// showAddr is a Redis address as an error may repeat it: quoted, cut
// when long, and without the password of a URL ("redis://:pw@host").
func showAddr(a string) string { return safetext.Quote(safetext.Redact(a)) }
