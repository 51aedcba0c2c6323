package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// A stop before registering is no failure once the process was told to
// stop; any other error, or one while it was not, still is.
func TestStoppedEarly(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	early := fmt.Errorf("engine: worker: stopped before it could register: %w", context.Canceled)
	other := errors.New("unregister: connection refused")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"nil", stopped, nil, false},
		{"stopped before registering", stopped, early, true},
		{"every lane stopped before registering", stopped, errors.Join(fmt.Errorf("lane 1: %w", early), fmt.Errorf("lane 2: %w", early)), true},
		{"one lane failed otherwise", stopped, errors.Join(fmt.Errorf("lane 1: %w", early), fmt.Errorf("lane 2: %w", other)), false},
		{"another error", stopped, other, false},
		{"not told to stop", context.Background(), early, false},
	} {
		if got := stoppedEarly(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: stoppedEarly = %v, want %v", tc.name, got, tc.want)
		}
	}
}
