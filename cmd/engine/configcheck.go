package main

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"gopkg.in/yaml.v3"
)

// pos is "file:line" for a file and the variable or flag name otherwise,
// where a line would mean nothing.
func pos(file string, line int) string {
	if strings.HasPrefix(file, "env ") || strings.HasPrefix(file, "flag ") {
		return file
	}
	return fmt.Sprintf("%s:%d", file, line)
}

// handlersNode reads the handlers mapping: task type → handler settings.
func (s *Settings) handlersNode(v *yaml.Node, file string) error {
	hs := map[string]HandlerSettings{}
	if isNull(v) {
		s.Handlers = hs
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return &ConfigError{Origin: pos(file, v.Line), Key: "handlers", Msg: "want a mapping of task type to {command: [...]}"}
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, hv := deref(v.Content[i]), deref(v.Content[i+1])
		key := "handlers." + k.Value
		at := pos(file, k.Line)
		if _, dup := hs[k.Value]; dup {
			return &ConfigError{Origin: at, Key: key, Msg: "set twice"}
		}
		if hv.Kind != yaml.MappingNode {
			return &ConfigError{Origin: at, Key: key, Msg: "want a mapping with command, env, dir, timeout, retry_later, kill_grace, output_cap"}
		}
		h, err := s.handlerNode(hv, key, file)
		if err != nil {
			return err
		}
		hs[k.Value] = h
		s.origin[key] = at
	}
	s.Handlers = hs
	return nil
}

func (s *Settings) handlerNode(n *yaml.Node, prefix, file string) (HandlerSettings, error) {
	h := defaultHandler()
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		key := prefix + "." + k.Value
		at := pos(file, k.Line)
		bad := func(format string, args ...any) error {
			return &ConfigError{Origin: at, Key: key, Msg: fmt.Sprintf(format, args...)}
		}
		s.origin[key] = at
		switch k.Value {
		case "command":
			switch v.Kind {
			case yaml.ScalarNode:
				h.Command = []string{"sh", "-c", v.Value}
			case yaml.SequenceNode:
				h.Command = nil
				for _, a := range v.Content {
					if a = deref(a); a.Kind != yaml.ScalarNode {
						return h, bad("want a list of arguments")
					}
					h.Command = append(h.Command, a.Value)
				}
			default:
				return h, bad("want a list of arguments, or a string for sh -c")
			}
		case "env":
			if v.Kind != yaml.MappingNode {
				return h, bad("want a mapping of NAME: value")
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				ek, ev := deref(v.Content[j]), deref(v.Content[j+1])
				if ev.Kind != yaml.ScalarNode || ek.Value == "" || strings.ContainsAny(ek.Value, "=\x00") {
					return h, &ConfigError{Origin: pos(file, ek.Line), Key: key + "." + ek.Value, Msg: "want NAME: value"}
				}
				h.Env[ek.Value] = ev.Value
			}
		case "dir", "timeout", "retry_later", "kill_grace", "output_cap":
			if v.Kind != yaml.ScalarNode || isNull(v) {
				return h, bad("want a single value")
			}
			if err := setHandlerField(&h, k.Value, v.Value); err != nil {
				return h, bad("%v", err)
			}
		default:
			return h, bad("unknown key (want command, env, dir, timeout, retry_later, kill_grace or output_cap)")
		}
	}
	return h, nil
}

func setHandlerField(h *HandlerSettings, field, text string) error {
	var err error
	switch field {
	case "dir":
		h.Dir = text
	case "timeout":
		h.Timeout, err = parseDuration(text)
	case "retry_later":
		h.RetryLater, err = parseDuration(text)
	case "kill_grace":
		h.KillGrace, err = parseDuration(text)
	case "output_cap":
		h.OutputCap, err = strconv.Atoi(text)
		if err != nil {
			return fmt.Errorf("%q: want a whole number of bytes", text)
		}
	}
	if err != nil {
		return fmt.Errorf("%q: want a duration such as 500ms, 30s or 1h30m", text)
	}
	return nil
}

// validate reports every value that cannot be used, each naming its key
// and where it came from, then lets engine.Config.Validate have its say.
func (s *Settings) validate() error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, &ConfigError{Origin: s.where(key), Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if _, _, err := net.SplitHostPort(s.Redis.Addr); err != nil || s.Redis.Addr == "" {
		bad("redis.addr", "%q: want host:port", s.Redis.Addr)
	}
	if s.Redis.DB < 0 {
		bad("redis.db", "%d: want 0 or more", s.Redis.DB)
	}
	if s.Redis.PoolSize < 0 {
		bad("redis.pool_size", "%d: want 0 (automatic) or more", s.Redis.PoolSize)
	} else if s.Redis.PoolSize > 0 && s.Redis.PoolSize < s.Concurrency+6 {
		bad("redis.pool_size", "%d: want at least concurrency (%d) + 6, or 0 for automatic", s.Redis.PoolSize, s.Concurrency)
	}
	durations := []struct {
		key string
		v   time.Duration
		min time.Duration
	}{
		{"redis.dial_timeout", s.Redis.DialTimeout, time.Millisecond},
		{"redis.read_timeout", s.Redis.ReadTimeout, 0},
		{"redis.write_timeout", s.Redis.WriteTimeout, 0},
		{"default_timeout", s.DefaultTimeout, time.Millisecond},
		{"lease_grace", s.LeaseGrace, time.Millisecond},
		{"heartbeat_interval", s.HeartbeatInterval, 10 * time.Millisecond},
		{"heartbeat_ttl", s.HeartbeatTTL, time.Second},
		{"idle_wait", s.IdleWait, time.Second},
		{"shutdown_timeout", s.ShutdownTimeout, 0},
		{"reap_interval", s.ReapInterval, 10 * time.Millisecond},
		{"retry.backoff_base", s.BackoffBase, time.Millisecond},
		{"retry.backoff_max", s.BackoffMax, time.Millisecond},
		{"done_retention", s.DoneRetention, 0},
		{"dead_retention", s.DeadRetention, time.Second},
	}
	for _, d := range durations {
		switch {
		case d.v < 0:
			bad(d.key, "%v: must not be negative", d.v)
		case d.v < d.min:
			bad(d.key, "%v: want at least %v", d.v, d.min)
		}
	}
	if s.Resolution < time.Millisecond || s.Resolution > time.Minute || s.Resolution%time.Millisecond != 0 {
		bad("resolution", "%v: want whole milliseconds from 1ms to 60s", s.Resolution)
	}
	if s.HeartbeatTTL%time.Second != 0 {
		bad("heartbeat_ttl", "%v: want whole seconds (Redis 2.4 TTLs are seconds)", s.HeartbeatTTL)
	} else if s.HeartbeatTTL < 2*s.HeartbeatInterval {
		bad("heartbeat_ttl", "%v: want at least twice heartbeat_interval (%v, %s)", s.HeartbeatTTL, s.HeartbeatInterval, s.where("heartbeat_interval"))
	}
	if s.IdleWait%time.Second != 0 {
		bad("idle_wait", "%v: want whole seconds (Redis 2.4 blocking timeouts are integers)", s.IdleWait)
	}

	if s.BackoffMax < s.BackoffBase && s.BackoffMax >= 0 {
		bad("retry.backoff_max", "%v: want at least retry.backoff_base (%v)", s.BackoffMax, s.BackoffBase)
	}
	if !buckets.ValidName(s.Namespace) {
		bad("namespace", "%q: want 1-64 of A-Z a-z 0-9 _ . -", s.Namespace)
	}
	if s.MaxPayload < 1 || s.MaxPayload > 512<<20 {
		bad("max_payload", "%d: want 1 byte to 512 MiB", s.MaxPayload)
	}
	if !buckets.ValidName(s.DefaultQueue) {
		bad("default_queue", "%q: want 1-64 of A-Z a-z 0-9 _ . -", s.DefaultQueue)
	}
	if s.DefaultMaxAttempts < 1 {
		bad("default_max_attempts", "%d: want at least 1", s.DefaultMaxAttempts)
	}
	s.validateQueues(bad)
	if s.Concurrency < 1 {
		bad("concurrency", "%d: want at least 1", s.Concurrency)
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
	if s.UnknownType != "retry" && s.UnknownType != "dead" {
		bad("unknown_type", "%q: want retry or dead", s.UnknownType)
	}
	if s.MaxRecoveries < 1 {
		bad("max_recoveries", "%d: want at least 1", s.MaxRecoveries)
	}
	if s.DispatchBuckets < 1 || s.DispatchBuckets > 10000 {
		bad("dispatch.max_buckets", "%d: want 1 to 10000", s.DispatchBuckets)
	}
	if s.DispatchLanes < 1 || s.DispatchLanes > 16 {
		bad("dispatch.lanes", "%d: want 1 to 16", s.DispatchLanes)
	}
	if s.DispatchTasks < 1 || s.DispatchTasks > 100000 {
		bad("dispatch.max_tasks", "%d: want 1 to 100000", s.DispatchTasks)
	}
	if _, err := parseLevel(s.LogLevel); err != nil {
		bad("log.level", "%q: want debug, info, warn or error", s.LogLevel)
	}
	if s.LogFormat != "text" && s.LogFormat != "json" {
		bad("log.format", "%q: want text or json", s.LogFormat)
	}
	s.validateHandlers(bad)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// A backstop: anything the checks above missed is still refused.
	if err := s.EngineConfig(nil).Validate(); err != nil {
		return &ConfigError{Origin: "config", Msg: err.Error()}
	}
	return nil
}

func (s *Settings) validateQueues(bad func(key, format string, args ...any)) {
	if len(s.Queues) == 0 {
		bad("queues", "empty: want at least one queue")
	}
	for i, q := range s.Queues {
		key := fmt.Sprintf("queues[%d]", i)
		if !buckets.ValidName(q.Name) {
			bad(key, "name %q: want 1-64 of A-Z a-z 0-9 _ . -", q.Name)
		}
		if slices.IndexFunc(s.Queues, func(o engine.QueueConfig) bool { return o.Name == q.Name }) != i {
			bad(key, "queue %q listed twice", q.Name)
		}
		if q.Weight < 1 {
			bad(key, "weight %d: want at least 1", q.Weight)
		}
	}
}

func (s *Settings) validateHandlers(bad func(key, format string, args ...any)) {
	types := make([]string, 0, len(s.Handlers))
	for t := range s.Handlers {
		types = append(types, t)
	}
	slices.Sort(types)
	for _, t := range types {
		h, key := s.Handlers[t], "handlers."+t
		if t == "" || len(t) > buckets.MaxTypeLen || !utf8.ValidString(t) || strings.ContainsFunc(t, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			bad(key, "task type %q: want 1-%d bytes of UTF-8 without control characters", t, buckets.MaxTypeLen)
		}
		if len(h.Command) == 0 || h.Command[0] == "" {
			bad(key+".command", "missing: want the command to run, e.g. [sh, -c, 'cat > /tmp/x']")
		}
		for _, d := range []struct {
			field string
			v     time.Duration
		}{{"timeout", h.Timeout}, {"retry_later", h.RetryLater}, {"kill_grace", h.KillGrace}} {
			if d.v < 0 {
				bad(key+"."+d.field, "%v: must not be negative", d.v)
			}
		}
		if h.KillGrace >= s.LeaseGrace {
			bad(key+".kill_grace", "%v: want less than lease_grace (%v, %s): a task whose command is still being killed must not be given to another worker yet",
				h.KillGrace, s.LeaseGrace, s.where("lease_grace"))
		}
		if h.OutputCap < 0 {
			bad(key+".output_cap", "%d: want 0 or more bytes", h.OutputCap)
		}
	}
}
