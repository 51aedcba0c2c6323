package engine

import (
	"errors"
	"strings"
	"testing"
)

// TestMetadataOption: metadata reaches Lookup and merges across options;
// metadata past the limits is refused before anything is written.
func TestMetadataOption(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	info, err := c.Enqueue(t.Context(), "t", nil, Metadata(map[string]string{"a": "1", "b": "x"}), Metadata(map[string]string{"b": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Lookup(t.Context(), info.ID)
	if err != nil || len(got.Metadata) != 2 || got.Metadata["a"] != "1" || got.Metadata["b"] != "2" {
		t.Fatalf("Lookup metadata %v, %v; want a=1 b=2", got.Metadata, err)
	}
	_, err = c.Enqueue(t.Context(), "t", nil, Metadata(map[string]string{"k": strings.Repeat("v", 5000)}))
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("oversized metadata: %v, want ErrInvalid", err)
	}
	_, err = c.Enqueue(t.Context(), "t", nil, Metadata(map[string]string{"": "v"}))
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("empty metadata key: %v, want ErrInvalid", err)
	}
}
