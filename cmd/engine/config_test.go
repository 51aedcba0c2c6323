package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/spf13/cobra"
)

// TestShippedConfig checks that config.yaml at the repository root sets
// every key, to exactly engine.DefaultConfig and the daemon's defaults,
// with one example handler at the handler defaults.
func TestShippedConfig(t *testing.T) {
	f, err := os.Open("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ParseConfig(f, "config.yaml")
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	for _, st := range settings {
		if o := got.where(st.key); !strings.HasPrefix(o, "config.yaml:") {
			t.Errorf("config.yaml does not set %s (origin %q)", st.key, o)
		}
	}
	ex, ok := got.Handlers["email.send"]
	if !ok || len(got.Handlers) != 1 {
		t.Fatalf("handlers = %v, want the email.send example only", got.Handlers)
	}
	if len(ex.Command) == 0 {
		t.Errorf("example handler has no command")
	}
	ex.Command = nil
	if want := defaultHandler(); !reflect.DeepEqual(ex, want) {
		t.Errorf("example handler = %+v, want the handler defaults %+v", ex, want)
	}
	eng := engine.DefaultConfig()
	if !reflect.DeepEqual(comparable(got.Engine), comparable(eng)) {
		t.Errorf("config.yaml differs from engine.DefaultConfig():\n got %+v\nwant %+v", got.Engine, eng)
	}
	want := Defaults()
	got.Handlers, want.Handlers = nil, nil
	got.origin, want.origin = nil, nil
	got.Engine, want.Engine = engine.Config{}, engine.Config{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config.yaml differs from Defaults():\n got %+v\nwant %+v", got, want)
	}
}

// comparable is c without the fields a file cannot set (functions, logger,
// clock).
func comparable(c engine.Config) engine.Config {
	c.RetryDelay, c.Logger, c.Advanced.Clock = nil, nil, nil
	return c
}

func parseString(t *testing.T, text string) (*Settings, error) {
	t.Helper()
	return ParseConfig(strings.NewReader(text), "cfg.yaml")
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // substrings of the error
	}{
		{"unknown key", "namespace: x\nconcurency: 5\n", []string{"cfg.yaml:2", "concurency", "unknown key", "did you mean concurrency"}},
		{"unknown nested key", "redis:\n  adr: x:1\n", []string{"cfg.yaml:2", "redis.adr", "unknown key", "did you mean redis.addr"}},
		{"wrong type int", "concurrency: ten\n", []string{"cfg.yaml:1", "concurrency", "whole number"}},
		{"wrong type bool", "\n\nstrict_priority: sometimes\n", []string{"cfg.yaml:3", "strict_priority", "true or false"}},
		{"duration without unit", "idle_wait: 10\n", []string{"cfg.yaml:1", "idle_wait", "duration"}},
		{"list for scalar", "namespace: [a, b]\n", []string{"cfg.yaml:1", "namespace", "single value"}},
		{"negative duration", "lease_grace: -5s\n", []string{"cfg.yaml:1", "lease_grace", "at least"}},
		{"negative concurrency", "\nconcurrency: -1\n", []string{"cfg.yaml:2", "concurrency", "at least 1"}},
		{"weight negative", "queues:\n  - name: a\n    weight: 2\n  - name: b\n    weight: -1\n", []string{"cfg.yaml:4", "queues[1]", "at least 1"}},
		{"queue twice", "queues:\n  - name: a\n  - name: a\n", []string{"cfg.yaml:3", "queues[1]", "twice"}},
		{"queue bad key", "queues:\n  - name: a\n    wieght: 3\n", []string{"cfg.yaml:3", "queues[0].wieght", "unknown"}},
		{"max_running negative", "queues:\n  - name: a\n    max_running: -2\n", []string{"cfg.yaml:2", "queues[0].max_running", "-2: want 0 (no limit) or more"}},
		{"rate malformed", "queues:\n  - name: a\n    rate: 10 per second\n", []string{"cfg.yaml:2", "queues[0].rate", "N/period"}},
		{"key_max_running negative", "queues:\n  - name: a\n    key_max_running: -1\n", []string{"cfg.yaml:2", "queues[0].key_max_running", "want 0 (no limit) or more"}},
		{"key_rate zero period", "queues:\n  - name: a\n    key_rate: 1/0s\n", []string{"cfg.yaml:2", "queues[0].key_rate", "period"}},
		{"fair", "queues:\n  - name: a\n    fair: true\n", []string{"cfg.yaml:3", "queues[0].fair", "always taken round-robin by key"}},
		{"no queues", "queues: []\n", []string{"cfg.yaml:1", "queues", "at least one"}},
		{"resolution too big", "resolution: 2m\n", []string{"cfg.yaml:1", "resolution", "1ms to 60s"}},
		{"resolution fraction", "resolution: 1500us\n", []string{"cfg.yaml:1", "resolution", "whole milliseconds"}},
		{"ttl vs interval", "heartbeat_interval: 20s\n", []string{"heartbeat_ttl", "twice heartbeat_interval"}},
		{"ttl fraction", "heartbeat_ttl: 2500ms\nheartbeat_interval: 1s\n", []string{"cfg.yaml:1", "heartbeat_ttl", "whole seconds"}},
		{"pool too small", "concurrency: 20\nredis:\n  pool_size: 10\n", []string{"cfg.yaml:3", "redis.pool_size", "concurrency"}},
		{"bad addr", "redis:\n  addr: localhost\n", []string{"cfg.yaml:2", "redis.addr", "host:port"}},
		{"negative db", "redis:\n  db: -1\n", []string{"cfg.yaml:2", "redis.db"}},
		{"cert without key", "redis:\n  tls: {cert_file: c.pem}\n", []string{"cfg.yaml:2", "redis.tls.cert_file", "key_file"}},
		{"negative read timeout", "redis:\n  read_timeout: -1s\n", []string{"cfg.yaml:2", "redis.read_timeout", "negative"}},
		{"section as scalar", "redis: localhost:6379\n", []string{"cfg.yaml:1", "redis", "mapping"}},
		{"set twice", "namespace: a\nnamespace: b\n", []string{"cfg.yaml:2", "namespace"}},
		{"bad namespace", "namespace: 'a b'\n", []string{"cfg.yaml:1", "namespace"}},
		{"bad role", "roles: [worker, janitor]\n", []string{"cfg.yaml:1", "roles", "janitor"}},
		{"no roles", "roles: []\n", []string{"cfg.yaml:1", "roles", "empty"}},
		{"unknown_type", "unknown_type: ignore\n", []string{"cfg.yaml:1", "unknown_type", "retry or dead"}},
		{"log level", "log:\n  level: loud\n", []string{"cfg.yaml:2", "log.level", "loud"}},
		{"log format", "log:\n  format: xml\n", []string{"cfg.yaml:2", "log.format"}},
		{"handler no command", "handlers:\n  x:\n    timeout: 5s\n", []string{"cfg.yaml:2", "handlers.x.command", "missing"}},
		{"handler unknown key", "handlers:\n  x:\n    command: [true]\n    retries: 3\n", []string{"cfg.yaml:4", "handlers.x.retries", "unknown key"}},
		{"handler bad duration", "handlers:\n  x:\n    command: [true]\n    snooze: soon\n", []string{"cfg.yaml:4", "handlers.x.snooze", "duration"}},
		{"handler negative", "handlers:\n  x:\n    command: [true]\n    kill_grace: -1s\n", []string{"cfg.yaml:4", "handlers.x.kill_grace", "negative"}},
		{"kill grace vs lease", "lease_grace: 2s\nhandlers:\n  x:\n    command: [true]\n", []string{"cfg.yaml:3", "handlers.x.kill_grace", "lease_grace", "cfg.yaml:1"}},
		{"handler env", "handlers:\n  x:\n    command: [true]\n    env: [A=1]\n", []string{"cfg.yaml:4", "handlers.x.env", "mapping"}},
		{"handlers list", "handlers: [a]\n", []string{"cfg.yaml:1", "handlers", "mapping"}},
		{"top level list", "- a\n- b\n", []string{"cfg.yaml:1", "mapping of settings"}},
		{"syntax", "redis:\n  addr: [\n", []string{"cfg.yaml:2", "YAML syntax"}},
		{"two documents", "namespace: a\n---\nnamespace: b\n", []string{"cfg.yaml:2", "one YAML document"}},
		{"null int", "concurrency:\n", []string{"cfg.yaml:1", "concurrency", "no value"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseString(t, c.yaml)
			if err == nil {
				t.Fatalf("no error for %q", c.yaml)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error %T is not a *ConfigError", err)
			}
		})
	}
}

// TestConfigManyErrors: one run reports every problem, in file order.
func TestConfigManyErrors(t *testing.T) {
	_, err := parseString(t, "concurency: 3\nqueues:\n  - {name: a, weight: x}\nresolution: 2m\nlog: {level: loud}\n")
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{"cfg.yaml:1: concurency: unknown key", "cfg.yaml:3: queues[0].weight: \"x\"", "cfg.yaml:4: resolution", "cfg.yaml:5: log.level"}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("error has %d lines, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

// TestConfigManyEngineErrors: every engine setting refused is reported,
// not only the first, each on the line that sets it.
func TestConfigManyEngineErrors(t *testing.T) {
	t.Parallel()
	_, err := parseString(t, "resolution: 2m\nheartbeat_ttl: 15s\nconcurrency: -1\n")
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{"cfg.yaml:1: resolution", "cfg.yaml:2: heartbeat_ttl", "cfg.yaml:3: concurrency"}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("error has %d lines, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

// TestConfigSyntaxErrorLine: a YAML syntax error names the bad line,
// not the line of the block around it.
func TestConfigSyntaxErrorLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, want string }{
		{"redis:\n  addr: x\n  tls:\n    cert_file: x\n   key_file: y\n", "cfg.yaml:5: "},
		{"namespace: a\nqueues:\n  - name: a\n  - name: b\n weight: 3\n", "cfg.yaml:5: "},
		{"namespace: a\nredis:\n  addr: x:1\n\tdb: 0\n", "cfg.yaml:4: "},
		{"redis:\n  addr: x\n  db: 0\n  password: x\n  user: y\n - a\n", "cfg.yaml:6: "},
		{"a: 1\nredis:\n  addr: x\n  tls: {cert_file: a\n  x: 1\n", "cfg.yaml:4: "},
		{"a: b: c\n", "cfg.yaml:1: "},
	} {
		_, err := parseString(t, c.yaml)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one starting %q", c.yaml, err, c.want)
		}
	}
}

// TestConfigRefusesBadHandlers: a command that is not a string or a list
// (a number, a boolean) and a task type with spaces are refused; a quoted
// number is a shell command line like any string.
func TestConfigRefusesBadHandlers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, want string }{
		{"handlers: {x: {command: 5}}\n", "handlers.x.command"},
		{"handlers:\n  x:\n    command: true\n", "handlers.x.command"},
		{"handlers: {'bad type': {command: [cat]}}\n", "handlers.bad type"},
	} {
		_, err := parseString(t, c.yaml)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one naming %s", c.yaml, err, c.want)
		}
	}
	if _, err := parseString(t, "handlers: {x: {command: '5'}}\n"); err != nil {
		t.Errorf("a quoted command: %v", err)
	}
}

// TestConfigGood: values land in engine.Config with its meaning (0 is
// the default, negative is none) and in the daemon's own settings.
func TestConfigGood(t *testing.T) {
	s, err := parseString(t, `
redis: {addr: "redis.internal:6380", user: app, password: 123456, db: 2, read_timeout: 0}
queues:
  - {name: critical, weight: 6}
  - name: low
    max_running: 3
    rate: 10/1s
    key_max_running: 1
    key_rate: 2/500ms
strict_priority: true
concurrency: 0
done_retention: -1s
shutdown_timeout: 0
unknown_type: dead
roles: dispatcher, reaper
handlers:
  resize: {command: "convert - out.png", env: {A: "1"}, output_cap: 10}
`)
	if err != nil {
		t.Fatal(err)
	}
	if s.Redis.Addr != "redis.internal:6380" || s.Redis.User != "app" || s.Redis.Password != "123456" || s.Redis.DB != 2 || s.Redis.ReadTimeout != 0 {
		t.Errorf("redis = %+v", s.Redis)
	}
	if want := []engine.QueueConfig{{Name: "critical", Weight: 6}, {Name: "low", MaxRunning: 3, Rate: "10/1s", KeyMaxRunning: 1, KeyRate: "2/500ms"}}; !reflect.DeepEqual(s.Engine.Queues, want) {
		t.Errorf("queues = %v, want %v", s.Engine.Queues, want)
	}
	if r := s.roles(); r != engine.RoleDispatcher|engine.RoleReaper {
		t.Errorf("roles = %+v", r)
	}
	h := s.Handlers["resize"]
	if !reflect.DeepEqual(h.Command, []string{"sh", "-c", "convert - out.png"}) || h.Env["A"] != "1" || h.OutputCap != 10 || h.Snooze != 30*time.Second {
		t.Errorf("handler = %+v", h)
	}
	if got, want := s.poolSize(), engine.DefaultConfig().Concurrency+10; got != want {
		t.Errorf("pool size with concurrency left at its default = %d, want %d", got, want)
	}
	cfg := s.engineConfig(nil)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.DoneRetention >= 0 || cfg.ShutdownTimeout != 0 || cfg.UnknownType != "dead" || !cfg.StrictPriority {
		t.Errorf("engine config = %+v", cfg)
	}
}

func TestEnvOverrides(t *testing.T) {
	environ := []string{
		"ENGINE_REDIS_ADDR=10.0.0.1:7000",
		"ENGINE_QUEUES=critical:6,default:3,low",
		"ENGINE_CONCURRENCY=32",
		"ENGINE_REDIS_TLS_ENABLED=true",
		"ENGINE_ROLES=worker",
		"ENGINE_HANDLERS={mail: {command: [sendmail, -t], timeout: 1m}}",
		"ENGINE_LOG_LEVEL=debug",
		"ENGINE_REDIS_ADRR=typo:1",
		"ENGINE_TASK_ID=not-a-setting-but-known",
		"PATH=/bin",
	}
	s, warnings, err := loadSettings(source{file: strings.NewReader("concurrency: 4\nnamespace: fromfile\n"), fileName: "cfg.yaml", environ: environ})
	if err != nil {
		t.Fatal(err)
	}
	wantQ := []engine.QueueConfig{{Name: "critical", Weight: 6}, {Name: "default", Weight: 3}, {Name: "low"}}
	switch {
	case s.Redis.Addr != "10.0.0.1:7000", !s.Redis.TLS.Enabled:
		t.Errorf("redis not overridden: %+v", s.Redis)
	case !reflect.DeepEqual(s.Engine.Queues, wantQ):
		t.Errorf("queues = %v, want %v", s.Engine.Queues, wantQ)
	case s.Engine.Concurrency != 32 || s.where("concurrency") != "env ENGINE_CONCURRENCY":
		t.Errorf("concurrency = %d from %s, want 32 from env", s.Engine.Concurrency, s.where("concurrency"))
	case s.Engine.Namespace != "fromfile" || s.where("namespace") != "cfg.yaml:2":
		t.Errorf("namespace = %q from %s", s.Engine.Namespace, s.where("namespace"))
	case !reflect.DeepEqual(s.Roles, []string{"worker"}), s.Log.Level != "debug":
		t.Errorf("roles %v, level %q", s.Roles, s.Log.Level)
	case s.Handlers["mail"].Timeout != time.Minute || s.Handlers["mail"].Command[0] != "sendmail":
		t.Errorf("handlers = %+v", s.Handlers)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "ENGINE_REDIS_ADRR") || !strings.Contains(warnings[0], "did you mean ENGINE_REDIS_ADDR") {
		t.Errorf("warnings = %q, want one about ENGINE_REDIS_ADRR suggesting ENGINE_REDIS_ADDR", warnings)
	}

	for env, want := range map[string][]string{
		"ENGINE_CONCURRENCY=abc":      {"env ENGINE_CONCURRENCY", "concurrency", "whole number"},
		"ENGINE_QUEUES=a:6,b:-1":      {"env ENGINE_QUEUES", "queues[1]", "at least 1"},
		"ENGINE_QUEUES=a:x":           {"env ENGINE_QUEUES", "queues[0].weight"},
		"ENGINE_RESOLUTION=2m":        {"env ENGINE_RESOLUTION", "resolution"},
		"ENGINE_IDLE_WAIT=-1s":        {"env ENGINE_IDLE_WAIT", "idle_wait", "at least"},
		"ENGINE_HANDLERS={x: {a: 1}":  {"env ENGINE_HANDLERS", "handlers"},
		"ENGINE_HANDLERS={x: {a: 1}}": {"env ENGINE_HANDLERS", "handlers.x.a", "unknown key"},
	} {
		_, _, err := loadSettings(source{environ: []string{env}})
		if err == nil {
			t.Errorf("%s: no error", env)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", env, err, w)
			}
		}
	}
}

// TestPrecedence checks file < environment < flags, through the flags a
// command registers.
func TestPrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("concurrency: 4\nnamespace: file\nlog:\n  level: warn\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &app{stdout: io.Discard, stderr: io.Discard, environ: []string{
		"ENGINE_CONFIG=" + path, "ENGINE_CONCURRENCY=8", "ENGINE_NAMESPACE=env", "ENGINE_REDIS_ADDR=env:1"}}
	cmd := &cobra.Command{}
	c := addCommon(cmd, [3]string{"concurrency", "concurrency", ""})
	if err := cmd.ParseFlags([]string{"--concurrency", "16", "--redis", "flag:2"}); err != nil {
		t.Fatal(err)
	}
	s, _, err := c.load(a, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine.Concurrency != 16 || s.where("concurrency") != "flag --concurrency" {
		t.Errorf("concurrency = %d from %s, want 16 from the flag", s.Engine.Concurrency, s.where("concurrency"))
	}
	if s.Redis.Addr != "flag:2" || s.Engine.Namespace != "env" || s.Log.Level != "warn" {
		t.Errorf("addr %q namespace %q level %q: want flag, env, file", s.Redis.Addr, s.Engine.Namespace, s.Log.Level)
	}
	if err := cmd.ParseFlags([]string{"--concurrency", "-3"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.load(a, cmd); err == nil || !strings.Contains(err.Error(), "flag --concurrency: concurrency") {
		t.Errorf("bad flag value: err = %v, want one naming the flag and key", err)
	}
}

// FuzzParseConfig: any text gives settings or a *ConfigError, never a
// panic, and settings it accepts build an engine that accepts them.
func FuzzParseConfig(f *testing.F) {
	if b, err := os.ReadFile("../../config.yaml"); err == nil {
		f.Add(string(b))
	}
	for _, s := range []string{
		"", "~", "[]", "a: b", "redis: {addr: x:1}", "queues: [{name: a, weight: 0}]",
		"handlers: {x: {command: [a], env: {A: B}}}", "resolution: 1ms\nidle_wait: 1s",
		"a: &x {b: *x}", "x: &a [*a]", "queues: *a", "<<: {namespace: a}", "handlers: {x: *y}",
		"redis:\n  tls: {enabled: yes}", "roles: \"\"", "queues: \"a:1,b:-1\"", "handlers: {'': {command: []}}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseConfig(strings.NewReader(text), "fuzz.yaml")
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *ConfigError: %v", err, err)
			}
			return
		}
		if err := s.engineConfig(nil).Validate(); err != nil {
			t.Fatalf("accepted settings refused by the engine: %v", err)
		}
	})
}
