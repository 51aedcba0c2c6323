package buckets

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// TestRecordMetadata: metadata is stored in a trailing section, pairs
// sorted by key, and decodes back to the same record.
func TestRecordMetadata(t *testing.T) {
	t.Parallel()
	r := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1}
	plain := r.Encode()
	r.Metadata = map[string]string{"b": "2", "a": "1"}
	b := r.Encode()
	if want := withSections(&Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1},
		[]byte{'m', 9, 2, 1, 'a', 1, '1', 1, 'b', 1, '2'}); !bytes.Equal(b, want) {
		t.Fatalf("record with metadata %q, want %q", b, want)
	}
	got, err := DecodeRecord("x", b)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("decode = %+v, %v; want %+v", got, err, r)
	}
	if got, err := DecodeRecord("x", plain); err != nil || got.Metadata != nil {
		t.Fatalf("without metadata: %+v, %v", got, err)
	}
}

// TestRecordUnknownSectionKept: an informational section a later release
// added is kept through decode and encode, so rewriting the record does
// not lose it.
func TestRecordUnknownSectionKept(t *testing.T) {
	t.Parallel()
	base := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte{}, State: StateWaiting}
	b := withSections(base, []byte{'m', 4, 1, 1, 'k', 0}, []byte{'z', 3, 'a', 'b', 'c'})
	got, err := DecodeRecord("x", b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), b) {
		t.Fatalf("rewritten as %q, stored %q", got.Encode(), b)
	}
	got.State = StateRunning
	again, err := DecodeRecord("x", got.Encode())
	if err != nil || again.Metadata["k"] != "" || len(again.Metadata) != 1 || len(again.extra) != 1 || !bytes.Equal(again.extra[0], []byte{'z', 3, 'a', 'b', 'c'}) {
		t.Fatalf("unknown section lost or metadata changed: %+v, %v", again, err)
	}
}

func TestRecordMetadataMalformed(t *testing.T) {
	t.Parallel()
	base := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte{}, State: StateWaiting}
	for name, secs := range map[string][][]byte{
		"duplicate section": {{'m', 4, 1, 1, 'k', 0}, {'m', 4, 1, 1, 'j', 0}},
		"duplicate key":     {{'m', 7, 2, 1, 'k', 0, 1, 'k', 0}},
		"empty section":     {{'m', 1, 0}},
		"short section":     {{'m', 9, 1}},
		"count too big":     {{'m', 3, 9, 1, 'k'}},
		"trailing in body":  {{'m', 5, 1, 1, 'k', 0, 0}},
	} {
		if _, err := DecodeRecord("x", withSections(base, secs...)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestValidateMetadata(t *testing.T) {
	t.Parallel()
	big := map[string]string{}
	for i := range MaxMetadata + 1 {
		big[string(rune('a'+i%26))+string(rune('a'+i/26))] = ""
	}
	for name, m := range map[string]map[string]string{
		"empty key": {"": "v"},
		"too many":  big,
		"too large": {"k": string(make([]byte, MaxMetadataBytes))},
		"bad utf-8": {"k": "\xff"},
		"long key":  {string(make([]byte, MaxMetadataKeyLen+1)): ""},
	} {
		if err := ValidateMetadata(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := ValidateMetadata(map[string]string{"traceparent": "00-x"}); err != nil {
		t.Errorf("good metadata refused: %v", err)
	}
}
