package main

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// Settings is the whole configuration of the engine binary: what
// config.yaml holds, after environment variables and flags were applied.
// Unlike engine.Config, no zero value here means "default": Defaults
// returns the defaults and every value is used as written.
type Settings struct {
	Redis RedisSettings

	Namespace          string
	Resolution         time.Duration
	MaxPayload         int
	DefaultQueue       string
	DefaultMaxAttempts int
	DefaultTimeout     time.Duration

	Queues         []engine.QueueConfig
	StrictPriority bool
	Concurrency    int
	Roles          []string

	LeaseGrace        time.Duration
	HeartbeatInterval time.Duration
	HeartbeatTTL      time.Duration
	IdleWait          time.Duration
	ShutdownTimeout   time.Duration
	ReapInterval      time.Duration
	BackoffBase       time.Duration
	BackoffMax        time.Duration
	UnknownType       string
	MaxRecoveries     int
	DoneRetention     time.Duration
	DeadRetention     time.Duration
	DispatchBuckets   int
	DispatchLanes     int
	DispatchTasks     int

	Handlers map[string]HandlerSettings

	LogLevel  string
	LogFormat string

	// origin maps a key ("redis.addr", "queues[1]", "handlers.x.timeout")
	// to where its value came from: "file:line", "env NAME" or "flag
	// --name". Keys left at their defaults are absent.
	origin map[string]string
}

// RedisSettings says how to reach Redis.
type RedisSettings struct {
	Addr         string
	Password     string
	DB           int
	TLS          TLSSettings
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolSize     int
}

// TLSSettings turns on TLS for servers behind it.
type TLSSettings struct {
	Enabled            bool
	CAFile             string
	ServerName         string
	InsecureSkipVerify bool
}

// HandlerSettings is the command `engine run` runs for one task type.
type HandlerSettings struct {
	Command    []string
	Env        map[string]string
	Dir        string
	Timeout    time.Duration // 0: the task's own timeout only
	RetryLater time.Duration // the delay asked for by exit code 75
	KillGrace  time.Duration // SIGTERM to SIGKILL of the process group
	OutputCap  int           // bytes of stdout and of stderr kept for the log
}

// Roles a process can run.
const (
	roleDispatcher = "dispatcher"
	roleReaper     = "reaper"
	roleWorker     = "worker"
)

var allRoles = []string{roleDispatcher, roleReaper, roleWorker}

// Defaults returns the default settings: the values config.yaml shows.
func Defaults() *Settings {
	return &Settings{
		Redis: RedisSettings{
			Addr:         "127.0.0.1:6379",
			DialTimeout:  5 * time.Second,
			ReadTimeout:  15 * time.Second,
			WriteTimeout: 10 * time.Second,
		},
		Namespace:          "bq",
		Resolution:         10 * time.Millisecond,
		MaxPayload:         512 << 10,
		DefaultQueue:       "default",
		DefaultMaxAttempts: 25,
		DefaultTimeout:     30 * time.Minute,
		Queues:             []engine.QueueConfig{{Name: "default", Weight: 1}},
		Concurrency:        10,
		Roles:              slices.Clone(allRoles),
		LeaseGrace:         30 * time.Second,
		HeartbeatInterval:  10 * time.Second,
		HeartbeatTTL:       30 * time.Second,
		IdleWait:           20 * time.Second,
		ShutdownTimeout:    30 * time.Second,
		ReapInterval:       30 * time.Second,
		BackoffBase:        time.Second,
		BackoffMax:         time.Hour,
		UnknownType:        "retry",
		MaxRecoveries:      5,
		DoneRetention:      10 * time.Minute,
		DeadRetention:      30 * 24 * time.Hour,
		DispatchBuckets:    128,
		DispatchLanes:      2,
		DispatchTasks:      4096,
		Handlers:           map[string]HandlerSettings{},
		LogLevel:           "info",
		LogFormat:          "text",
		origin:             map[string]string{},
	}
}

// defaultHandler is what a handler entry starts from.
func defaultHandler() HandlerSettings {
	return HandlerSettings{Env: map[string]string{}, RetryLater: 30 * time.Second,
		KillGrace: 5 * time.Second, OutputCap: 64 << 10}
}

// setting is one key of the configuration; ptr returns the field it sets,
// whose type decides how a value is read.
type setting struct {
	key string
	ptr func(*Settings) any
}

// settings lists every key. Its order is config.yaml's.
var settings = []setting{
	{"redis.addr", func(s *Settings) any { return &s.Redis.Addr }},
	{"redis.password", func(s *Settings) any { return &s.Redis.Password }},
	{"redis.db", func(s *Settings) any { return &s.Redis.DB }},
	{"redis.tls.enabled", func(s *Settings) any { return &s.Redis.TLS.Enabled }},
	{"redis.tls.ca_file", func(s *Settings) any { return &s.Redis.TLS.CAFile }},
	{"redis.tls.server_name", func(s *Settings) any { return &s.Redis.TLS.ServerName }},
	{"redis.tls.insecure_skip_verify", func(s *Settings) any { return &s.Redis.TLS.InsecureSkipVerify }},
	{"redis.dial_timeout", func(s *Settings) any { return &s.Redis.DialTimeout }},
	{"redis.read_timeout", func(s *Settings) any { return &s.Redis.ReadTimeout }},
	{"redis.write_timeout", func(s *Settings) any { return &s.Redis.WriteTimeout }},
	{"redis.pool_size", func(s *Settings) any { return &s.Redis.PoolSize }},
	{"namespace", func(s *Settings) any { return &s.Namespace }},
	{"resolution", func(s *Settings) any { return &s.Resolution }},
	{"max_payload", func(s *Settings) any { return &s.MaxPayload }},
	{"default_queue", func(s *Settings) any { return &s.DefaultQueue }},
	{"default_max_attempts", func(s *Settings) any { return &s.DefaultMaxAttempts }},
	{"default_timeout", func(s *Settings) any { return &s.DefaultTimeout }},
	{"queues", func(s *Settings) any { return &s.Queues }},
	{"strict_priority", func(s *Settings) any { return &s.StrictPriority }},
	{"concurrency", func(s *Settings) any { return &s.Concurrency }},
	{"roles", func(s *Settings) any { return &s.Roles }},
	{"lease_grace", func(s *Settings) any { return &s.LeaseGrace }},
	{"heartbeat_interval", func(s *Settings) any { return &s.HeartbeatInterval }},
	{"heartbeat_ttl", func(s *Settings) any { return &s.HeartbeatTTL }},
	{"idle_wait", func(s *Settings) any { return &s.IdleWait }},
	{"shutdown_timeout", func(s *Settings) any { return &s.ShutdownTimeout }},
	{"reap_interval", func(s *Settings) any { return &s.ReapInterval }},
	{"retry.backoff_base", func(s *Settings) any { return &s.BackoffBase }},
	{"retry.backoff_max", func(s *Settings) any { return &s.BackoffMax }},
	{"unknown_type", func(s *Settings) any { return &s.UnknownType }},
	{"max_recoveries", func(s *Settings) any { return &s.MaxRecoveries }},
	{"done_retention", func(s *Settings) any { return &s.DoneRetention }},
	{"dead_retention", func(s *Settings) any { return &s.DeadRetention }},
	{"dispatch.max_buckets", func(s *Settings) any { return &s.DispatchBuckets }},
	{"dispatch.max_tasks", func(s *Settings) any { return &s.DispatchTasks }},
	{"dispatch.lanes", func(s *Settings) any { return &s.DispatchLanes }},
	{"handlers", func(s *Settings) any { return &s.Handlers }},
	{"log.level", func(s *Settings) any { return &s.LogLevel }},
	{"log.format", func(s *Settings) any { return &s.LogFormat }},
}

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
	for name, role := range map[string]engine.Roles{roleDispatcher: engine.RoleDispatcher, roleReaper: engine.RoleReaper, roleWorker: engine.RoleWorker} {
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
	return s.Concurrency + 10
}

// EngineConfig maps the settings onto engine.Config. The result passes
// engine.Config.Validate whenever s passed validate.
func (s *Settings) EngineConfig(log *slog.Logger) engine.Config {
	cfg := engine.Config{
		Namespace:          s.Namespace,
		Resolution:         s.Resolution,
		MaxPayload:         s.MaxPayload,
		DefaultQueue:       s.DefaultQueue,
		DefaultMaxAttempts: s.DefaultMaxAttempts,
		DefaultTimeout:     s.DefaultTimeout,
		Queues:             slices.Clone(s.Queues),
		StrictPriority:     s.StrictPriority,
		Concurrency:        s.Concurrency,
		LeaseGrace:         s.LeaseGrace,
		HeartbeatInterval:  s.HeartbeatInterval,
		HeartbeatTTL:       s.HeartbeatTTL,
		IdleWait:           s.IdleWait,
		ShutdownTimeout:    s.ShutdownTimeout,
		RetryDelay:         backoff(s.BackoffBase, s.BackoffMax),
		MaxRecoveries:      s.MaxRecoveries,
		DoneRetention:      s.DoneRetention,
		DeadRetention:      s.DeadRetention,
		ReapInterval:       s.ReapInterval,
		DispatchBuckets:    s.DispatchBuckets,
		DispatchTasks:      s.DispatchTasks,
		DispatchLanes:      s.DispatchLanes,
		Logger:             log,
	}
	if s.UnknownType == "dead" {
		cfg.UnknownType = engine.UnknownDead
	}
	// In engine.Config zero means "default"; here it means zero.
	if cfg.DoneRetention == 0 {
		cfg.DoneRetention = -1 // keep no record
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = -1 // return running tasks at once
	}
	if cfg.MaxRecoveries == 0 {
		cfg.MaxRecoveries = -1 // no recovery: dead at the first
	}
	return cfg
}

// backoff waits base·2^(attempt-1), capped at max, drawn uniformly from
// the upper half of that, like engine.DefaultRetryDelay (which is base 1s,
// max 1h).
func backoff(base, maxWait time.Duration) func(*engine.Task, int, error) time.Duration {
	return func(_ *engine.Task, attempt int, _ error) time.Duration {
		d := base
		for i := 1; i < attempt && d < maxWait; i++ {
			d *= 2
		}
		d = min(d, maxWait)
		return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	}
}
