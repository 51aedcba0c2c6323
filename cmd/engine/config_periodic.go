package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"gopkg.in/yaml.v3"
)

// PeriodicSettings is one item of the periodic: list, an engine.Periodic
// as the configuration writes it.
type PeriodicSettings struct {
	Name, Cron, Every, TZ, Type, Queue, Payload, Missed string
	SkipIfRunning                                       bool
	Timeout                                             time.Duration
	MaxAttempts                                         int
}

// periodicKeys are the keys of a periodic item, in the order the errors
// list them.
var periodicKeys = []string{"name", "cron", "every", "tz", "type", "queue", "payload", "missed",
	"skip_if_running", "timeout", "max_attempts"}

func periodicField(p *PeriodicSettings, key string) any {
	return map[string]any{"name": &p.Name, "cron": &p.Cron, "every": &p.Every, "tz": &p.TZ, "type": &p.Type,
		"queue": &p.Queue, "payload": &p.Payload, "missed": &p.Missed, "skip_if_running": &p.SkipIfRunning,
		"timeout": &p.Timeout, "max_attempts": &p.MaxAttempts}[key]
}

// setPeriodic reads the periodic: list, each item a mapping of
// periodicKeys, recording where each came from as periodic[i] and
// periodic[i].key.
func (s *Settings) setPeriodic(key string, p *[]PeriodicSettings, v *yaml.Node, at, file string) error {
	if isNull(v) {
		*p = nil
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return &ConfigError{Origin: at, Key: key, Msg: "want a list of {name, cron or every, type, ...}"}
	}
	var out []PeriodicSettings
	var errs []error
	for i, it := range v.Content {
		it = root(it)
		ikey, iat := fmt.Sprintf("%s[%d]", key, i), pos(file, it.Line)
		s.origin[ikey] = iat
		var ps PeriodicSettings
		if it.Kind != yaml.MappingNode {
			errs = append(errs, &ConfigError{Origin: iat, Key: ikey, Msg: "want a mapping with " + strings.Join(periodicKeys, ", ")})
			continue
		}
		err := mapping(it, ikey, file, func(fkey string, fv *yaml.Node, fat string) error {
			f := periodicField(&ps, strings.TrimPrefix(fkey, ikey+"."))
			if f == nil {
				return &ConfigError{Origin: fat, Key: fkey, Msg: "unknown key (want " + strings.Join(periodicKeys, ", ") + ")"}
			}
			return s.setValue(fkey, f, fv, fat, file)
		})
		errs = append(errs, err)
		out = append(out, ps)
	}
	*p = out
	return errors.Join(errs...)
}

// periodics turns the periodic: list into engine entries.
func (s *Settings) periodics() ([]engine.Periodic, error) {
	var out []engine.Periodic
	for _, ps := range s.Periodic {
		p := engine.Periodic{Name: ps.Name, Cron: ps.Cron, Location: ps.TZ, Type: ps.Type, Queue: ps.Queue,
			Payload: []byte(ps.Payload), Missed: ps.Missed, SkipIfRunning: ps.SkipIfRunning,
			Timeout: ps.Timeout, MaxAttempts: ps.MaxAttempts}
		if ps.Every != "" {
			d, err := time.ParseDuration(ps.Every)
			if err != nil {
				return nil, fmt.Errorf("every %q: want a duration such as 30s or 5m", ps.Every)
			}
			p.Every = d
		}
		out = append(out, p)
	}
	return out, nil
}

// validatePeriodic reports each bad periodic item under its key.
func (s *Settings) validatePeriodic(bad func(key, format string, args ...any)) {
	seen := map[string]bool{}
	for i, ps := range s.Periodic {
		key := fmt.Sprintf("periodic[%d]", i)
		if seen[ps.Name] {
			bad(key+".name", "%q declared twice", ps.Name)
		}
		seen[ps.Name] = true
		if ps.Every != "" {
			if _, err := time.ParseDuration(ps.Every); err != nil {
				bad(key+".every", "%q: want a duration such as 30s or 5m", ps.Every)
				continue
			}
		}
		ps2 := *s
		ps2.Periodic = []PeriodicSettings{ps}
		eps, _ := ps2.periodics()
		if err := eps[0].Validate(s.Engine); err != nil {
			bad(key, "%s", strings.TrimPrefix(strings.TrimSuffix(err.Error(), ": "+engine.ErrInvalid.Error()), "engine: "))
		}
	}
}

// addPeriodics declares the periodic: entries on srv, whatever its roles:
// the server's scheduler keeps their firings enqueued, and the handler of
// each entry's type runs them like any task.
func addPeriodics(srv *engine.Server, set *Settings) error {
	ps, err := set.periodics()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if err := srv.AddPeriodic(p); err != nil {
			return err
		}
	}
	return nil
}
