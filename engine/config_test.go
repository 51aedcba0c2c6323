package engine

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestConfigValidateNamesField: Validate's error is a *ConfigError naming
// the field as written in Go, and matches ErrInvalid.
func TestConfigValidateNamesField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{Concurrency: -1}, "Concurrency"},
		{Config{Advanced: AdvancedConfig{ClaimBatch: -1}}, "Advanced.ClaimBatch"},
		{Config{Advanced: AdvancedConfig{ClaimBatch: 1001}}, "Advanced.ClaimBatch"},
		{Config{Advanced: AdvancedConfig{GroupCommitWindow: 101 * time.Millisecond}}, "Advanced.GroupCommitWindow"},
		{Config{Advanced: AdvancedConfig{GroupCommitMax: -1}}, "Advanced.GroupCommitMax"},
		{Config{Queues: []QueueConfig{{Name: "a"}, {Name: "b", Weight: -2}}}, "Queues[1].Weight"},
		{Config{Advanced: AdvancedConfig{HeartbeatInterval: 20 * time.Second, HeartbeatTTL: 30 * time.Second}}, "Advanced.HeartbeatTTL"},
		{Config{Advanced: AdvancedConfig{Resolution: 2 * time.Minute}}, "Advanced.Resolution"},
	} {
		err := c.cfg.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want a *ConfigError for %s matching ErrInvalid", c.cfg, err, c.field)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
}

// TestConfigValidateReportsAll: Validate reports every setting it
// refuses, each a *ConfigError, not only the first.
func TestConfigValidateReportsAll(t *testing.T) {
	t.Parallel()
	err := Config{Concurrency: -1, Advanced: AdvancedConfig{Resolution: 2 * time.Minute, HeartbeatTTL: 15 * time.Second}}.Validate()
	var fields []string
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var ce *ConfigError
		if errors.As(err, &ce) {
			fields = append(fields, ce.Field)
		}
	}
	walk(err)
	want := []string{"Advanced.Resolution", "Concurrency", "Advanced.HeartbeatTTL"}
	if !slices.Equal(fields, want) {
		t.Fatalf("Validate reported %v (%v), want %v", fields, err, want)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v does not match ErrInvalid", err)
	}
}
