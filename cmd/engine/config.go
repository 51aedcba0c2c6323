package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/httpserver"
	"github.com/bucketq/bucketq/internal/safetext"
)

// Settings is the whole configuration of the engine binary. Engine holds
// the engine's settings with engine.Config's own meaning (zero is the
// default, engine.Config.Validate judges them); the rest is what only the
// daemon has: how to reach Redis, which roles to run, handler commands,
// logging.
type Settings struct {
	Engine   engine.Config
	Redis    RedisSettings
	Roles    []string
	Handlers map[string]HandlerSettings
	Periodic []PeriodicSettings // config_periodic.go
	Shards   ShardSettings      // config_shards.go
	Log      struct{ Level, Format string }
	HTTP     HTTPSettings

	// origin maps a key ("redis.addr", "queues[1]", "handlers.x.timeout")
	// to where its value came from: "file:line", "env NAME" or "flag
	// --name". Keys left at their defaults are absent.
	origin map[string]string
}

// RedisSettings says how to reach Redis.
type RedisSettings struct {
	Addr, User, Password string
	DB                   int
	TLS                  struct {
		Enabled                               bool
		CAFile, CertFile, KeyFile, ServerName string
		InsecureSkipVerify                    bool
	}
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	PoolSize                               int
	RedisModeSettings                      // config_redis_mode.go
}

// HTTPSettings is the HTTP server of `engine run` and `engine dashboard`
// (health endpoints and the dashboard). Addr empty: no server.
type HTTPSettings struct {
	Addr      string // host:port; an empty host is 127.0.0.1
	TokenFile string // file holding the token that allows changes; ENGINE_HTTP_TOKEN otherwise
	// ReadTokenFile holds the read token, needed (or the token) to see
	// the dashboard and /metrics; ENGINE_HTTP_READ_TOKEN otherwise.
	ReadTokenFile string
	ReadOnly      bool // the dashboard offers and accepts no change
	SecureCookies bool // every cookie Secure, for a TLS proxy that sends no X-Forwarded-Proto
}

// HandlerSettings is the command `engine run` runs for one task type.
type HandlerSettings struct {
	Command   []string
	Env       map[string]string
	Dir       string
	Timeout   time.Duration // 0: the task's own timeout only
	Snooze    time.Duration // the delay asked for by exit code 75
	KillGrace time.Duration // SIGTERM to SIGKILL of the process group
	OutputCap int           // bytes of stdout and of stderr kept for the log
}

var allRoles = []string{"dispatcher", "reaper", "worker"}

// Defaults returns the default settings: engine.DefaultConfig and the
// daemon's own, the values config.yaml shows.
func Defaults() *Settings {
	s := &Settings{Engine: engine.DefaultConfig(), Roles: slices.Clone(allRoles),
		Handlers: map[string]HandlerSettings{}, origin: map[string]string{}}
	s.Redis.Addr = "127.0.0.1:6379"
	s.Redis.DialTimeout, s.Redis.ReadTimeout, s.Redis.WriteTimeout = 5*time.Second, 15*time.Second, 10*time.Second
	s.Log.Level, s.Log.Format = "info", "text"
	redisModeDefaults(s)
	return s
}

// defaultHandler is what a handler entry starts from.
func defaultHandler() HandlerSettings {
	return HandlerSettings{Env: map[string]string{}, Snooze: 30 * time.Second,
		KillGrace: 5 * time.Second, OutputCap: 64 << 10}
}

// setting is one key of the configuration; ptr returns the field it sets,
// whose type decides how a value is read.
type setting struct {
	key string
	ptr func(*Settings) any
}

// engineFields maps each key of the engine's settings to its
// engine.Config field: the file, the environment and flags write straight
// into an engine.Config.
var engineFields = map[string]string{
	"namespace": "Namespace", "resolution": "Advanced.Resolution", "max_payload": "MaxPayload",
	"default_queue": "DefaultQueue", "default_max_attempts": "DefaultMaxAttempts",
	"default_timeout": "DefaultTimeout", "queues": "Queues", "strict_priority": "StrictPriority",
	"allow_eviction": "AllowEviction",
	"concurrency":    "Concurrency", "lease_grace": "Advanced.LeaseGrace", "heartbeat_interval": "Advanced.HeartbeatInterval",
	"heartbeat_ttl": "Advanced.HeartbeatTTL", "idle_wait": "Advanced.IdleWait", "shutdown_timeout": "ShutdownTimeout",
	"reap_interval": "Advanced.ReapInterval", "unknown_type": "UnknownType", "max_recoveries": "Advanced.MaxRecoveries",
	"max_snoozes":        "Advanced.MaxSnoozes",
	"unknown_type_grace": "Advanced.UnknownTypeGrace",
	"done_retention":     "DoneRetention", "dead_retention": "DeadRetention",
	"max_result": "MaxResult", "result_retention": "ResultRetention",
	"dispatch.max_buckets": "Advanced.DispatchBuckets", "dispatch.max_tasks": "Advanced.DispatchTasks", "dispatch.lanes": "Advanced.DispatchLanes",
	"claim_batch": "Advanced.ClaimBatch", "prefetch.max": "Advanced.Prefetch", "prefetch.wait": "Advanced.PrefetchWait",
	"group_commit.window": "Advanced.GroupCommitWindow", "group_commit.max": "Advanced.GroupCommitMax",
	"enqueue_group.max": "Advanced.EnqueueGroupMax", "enqueue_group.lanes": "Advanced.EnqueueGroupLanes",
}

// settings lists every key, sorted: the daemon's own and the engine's.
var settings = func() []setting {
	out := []setting{
		{"redis.addr", func(s *Settings) any { return &s.Redis.Addr }},
		{"redis.user", func(s *Settings) any { return &s.Redis.User }},
		{"redis.password", func(s *Settings) any { return &s.Redis.Password }},
		{"redis.db", func(s *Settings) any { return &s.Redis.DB }},
		{"redis.tls.enabled", func(s *Settings) any { return &s.Redis.TLS.Enabled }},
		{"redis.tls.ca_file", func(s *Settings) any { return &s.Redis.TLS.CAFile }},
		{"redis.tls.cert_file", func(s *Settings) any { return &s.Redis.TLS.CertFile }},
		{"redis.tls.key_file", func(s *Settings) any { return &s.Redis.TLS.KeyFile }},
		{"redis.tls.server_name", func(s *Settings) any { return &s.Redis.TLS.ServerName }},
		{"redis.tls.insecure_skip_verify", func(s *Settings) any { return &s.Redis.TLS.InsecureSkipVerify }},
		{"redis.dial_timeout", func(s *Settings) any { return &s.Redis.DialTimeout }},
		{"redis.read_timeout", func(s *Settings) any { return &s.Redis.ReadTimeout }},
		{"redis.write_timeout", func(s *Settings) any { return &s.Redis.WriteTimeout }},
		{"redis.pool_size", func(s *Settings) any { return &s.Redis.PoolSize }},
		{"roles", func(s *Settings) any { return &s.Roles }},
		{"handlers", func(s *Settings) any { return &s.Handlers }},
		{"periodic", func(s *Settings) any { return &s.Periodic }},
		{"log.level", func(s *Settings) any { return &s.Log.Level }},
		{"log.format", func(s *Settings) any { return &s.Log.Format }},
		{"http.addr", func(s *Settings) any { return &s.HTTP.Addr }},
		{"http.token_file", func(s *Settings) any { return &s.HTTP.TokenFile }},
		{"http.read_only", func(s *Settings) any { return &s.HTTP.ReadOnly }},
		{"http.read_token_file", func(s *Settings) any { return &s.HTTP.ReadTokenFile }},
		{"http.secure_cookies", func(s *Settings) any { return &s.HTTP.SecureCookies }},
	}
	out = append(out, redisModeSettings...)
	for key, field := range engineFields {
		out = append(out, setting{key, func(s *Settings) any {
			v := reflect.ValueOf(&s.Engine).Elem()
			for _, name := range strings.Split(field, ".") {
				v = v.FieldByName(name)
			}
			return v.Addr().Interface()
		}})
	}
	slices.SortFunc(out, func(a, b setting) int { return strings.Compare(a.key, b.key) })
	return out
}()

// envName is the environment variable that overrides key: ENGINE_, then
// the key upper-cased with dots as underscores.
func envName(key string) string {
	return "ENGINE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// where says where key's value came from: its own origin, else its
// nearest enclosing key's ("handlers.x" for "handlers.x.command"), else
// "default".
func (s *Settings) where(key string) string {
	for {
		if o, ok := s.origin[key]; ok {
			return o
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			return "default"
		}
		key = key[:i]
	}
}

// roles turns the role list into engine.Roles.
func (s *Settings) roles() engine.Roles {
	var r engine.Roles
	for name, role := range map[string]engine.Roles{"dispatcher": engine.RoleDispatcher, "reaper": engine.RoleReaper, "worker": engine.RoleWorker} {
		if slices.Contains(s.Roles, name) {
			r |= role
		}
	}
	return r
}

// poolSize is the pool's limit: redis.pool_size, or concurrency plus
// room for the dispatcher, reaper, heartbeat and wake-up waits.
func (s *Settings) poolSize() int {
	if s.Redis.PoolSize > 0 {
		return s.Redis.PoolSize
	}
	return cmp.Or(s.Engine.Concurrency, engine.DefaultConfig().Concurrency) + 10
}

// validate reports every value that cannot be used, each naming its key
// and where it came from. The engine's settings are judged by
// engine.Config.Validate alone; the checks here are the daemon's own.
func (s *Settings) validate() error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, &ConfigError{Origin: s.where(key), Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	for _, err := range engineErrors(s.Engine.Validate()) {
		var fe *engine.ConfigError
		if !errors.As(err, &fe) {
			errs = append(errs, err)
			continue
		}
		// "Queues[1].Weight" is queues[1].weight.
		name, rest, _ := strings.Cut(fe.Field, "[")
		key := ""
		for k, f := range engineFields {
			if f == name {
				key = k
			}
		}
		if rest != "" {
			key += "[" + strings.NewReplacer("keymaxrunning", "key_max_running", "keyrate", "key_rate", "maxrunning", "max_running").Replace(strings.ToLower(rest))
		}
		msg := fe.Msg
		for k, f := range engineFields {
			msg = strings.ReplaceAll(msg, f+" ", k+" ")
		}
		bad(key, "%s", msg)
	}
	eng := s.Engine
	if _, _, err := net.SplitHostPort(s.Redis.Addr); err != nil || s.Redis.Addr == "" {
		bad("redis.addr", "%s: want host:port", showAddr(s.Redis.Addr))
	}
	if s.Redis.DB < 0 {
		bad("redis.db", "%d: want 0 or more", s.Redis.DB)
	}
	if (s.Redis.TLS.CertFile == "") != (s.Redis.TLS.KeyFile == "") {
		bad("redis.tls.cert_file", "want both cert_file and key_file, or neither")
	}
	if n := cmp.Or(eng.Concurrency, engine.DefaultConfig().Concurrency); s.Redis.PoolSize < 0 || (s.Redis.PoolSize > 0 && s.Redis.PoolSize < n+6) {
		bad("redis.pool_size", "%d: want 0 (automatic), or at least concurrency (%d) + 6", s.Redis.PoolSize, n)
	}
	for key, d := range map[string]time.Duration{"redis.dial_timeout": s.Redis.DialTimeout,
		"redis.read_timeout": s.Redis.ReadTimeout, "redis.write_timeout": s.Redis.WriteTimeout} {
		if d < 0 {
			bad(key, "%v: must not be negative", d)
		}
	}
	if len(s.Roles) == 0 {
		bad("roles", "empty: want some of %s", strings.Join(allRoles, ", "))
	}
	for i, r := range s.Roles {
		if !slices.Contains(allRoles, r) {
			bad("roles", "%q: want some of %s", r, strings.Join(allRoles, ", "))
		} else if slices.Index(s.Roles, r) != i {
			bad("roles", "%q listed twice", r)
		}
	}
	if _, err := parseLevel(s.Log.Level); err != nil {
		bad("log.level", "%q: want debug, info, warn or error", s.Log.Level)
	}
	if s.Log.Format != "text" && s.Log.Format != "json" {
		bad("log.format", "%q: want text or json", s.Log.Format)
	}
	if s.HTTP.Addr != "" {
		if _, err := httpserver.ResolveAddr(s.HTTP.Addr); err != nil {
			bad("http.addr", "%q: want host:port, e.g. 127.0.0.1:9090 (an empty host is 127.0.0.1), or \"\" for no HTTP server", s.HTTP.Addr)
		}
	}
	types := make([]string, 0, len(s.Handlers))
	for t := range s.Handlers {
		types = append(types, t)
	}
	slices.Sort(types)
	lease := eng.Advanced.LeaseGrace
	if lease == 0 {
		lease = engine.DefaultConfig().Advanced.LeaseGrace
	}
	for _, t := range types {
		h, key := s.Handlers[t], "handlers."+t
		if err := checkTaskType(t); err != nil {
			bad(key, "%v", err)
		}
		if len(h.Command) == 0 || h.Command[0] == "" {
			bad(key+".command", "missing: want the command to run, e.g. [sh, -c, 'cat > /tmp/x']")
		}
		for f, d := range map[string]time.Duration{"timeout": h.Timeout, "snooze": h.Snooze, "kill_grace": h.KillGrace} {
			if d < 0 {
				bad(key+"."+f, "%v: must not be negative", d)
			}
		}
		if h.KillGrace >= lease {
			bad(key+".kill_grace", "%v: want less than lease_grace (%v, %s): a task whose command is still being killed must not be given to another worker yet",
				h.KillGrace, lease, s.where("lease_grace"))
		}
		if h.OutputCap < 0 {
			bad(key+".output_cap", "%d: want 0 or more bytes", h.OutputCap)
		}
	}
	s.validatePeriodic(bad)
	s.validateShards(bad)
	s.validateRedisMode(bad)
	return errors.Join(errs...)
}

// checkTaskType refuses a task type that no handler could be meant for:
// empty, too long, not UTF-8, or with control characters or white space
// (a quoting slip on a command line).
func checkTaskType(t string) error {
	if t == "" || len(t) > buckets.MaxTypeLen || !utf8.ValidString(t) ||
		strings.ContainsFunc(t, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) {
		return fmt.Errorf("task type %s: want 1-%d bytes of UTF-8 without spaces or control characters", safetext.Quote(t), buckets.MaxTypeLen)
	}
	return nil
}

// engineErrors lists the errors engine.Config.Validate joined (each a
// *engine.ConfigError), or err alone.
func engineErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// engineConfig is the engine's settings, with the shard map's version
// (shards.version), logging to log.
func (s *Settings) engineConfig(log *slog.Logger) engine.Config {
	c := s.Engine
	c.Queues, c.Logger = slices.Clone(c.Queues), log
	c.Advanced.MapVersion = int64(s.Shards.Version)
	return c
}
