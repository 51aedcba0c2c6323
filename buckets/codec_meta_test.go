package buckets

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// TestRecordMetadataVersions: earlier releases wrote a record without
// metadata as version 1, one with metadata as version 2; both decode, the
// latter to the same record.
func TestRecordMetadataVersions(t *testing.T) {
	r := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1}
	v1 := encodeLegacy(r)
	if v1[1] != 1 {
		t.Fatalf("record without metadata written as version %d, want 1", v1[1])
	}
	r.Metadata = map[string]string{"b": "2", "a": "1"}
	v2 := encodeLegacy(r)
	if v2[1] != 2 || !bytes.HasPrefix(v2[2:], v1[2:]) {
		t.Fatalf("record with metadata: version %d, and its first part should be the version-1 record", v2[1])
	}
	got, err := DecodeRecord("x", v2)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("decode = %+v, %v; want %+v", got, err, r)
	}
	// A version-1 reader's record (no trailer) still decodes, without metadata.
	got, err = DecodeRecord("x", v1)
	if err != nil || got.Metadata != nil {
		t.Fatalf("version 1: %+v, %v", got, err)
	}
}

// TestRecordUnknownSectionKept: a trailing section of a later version is
// kept through decode and encode, so rewriting the record does not lose it.
func TestRecordUnknownSectionKept(t *testing.T) {
	r := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte{}, State: StateWaiting, Metadata: map[string]string{"k": "v"}}
	b := append(r.Encode(), 'z', 3, 'a', 'b', 'c')
	got, err := DecodeRecord("x", b)
	if err != nil {
		t.Fatal(err)
	}
	got.State = StateRunning
	again, err := DecodeRecord("x", got.Encode())
	if err != nil || !bytes.HasSuffix(got.Encode(), []byte{'z', 3, 'a', 'b', 'c'}) || again.Metadata["k"] != "v" {
		t.Fatalf("unknown section lost or metadata changed: %q, %v", got.Encode(), err)
	}
}

func TestRecordMetadataMalformed(t *testing.T) {
	base := encodeLegacy(&Record{ID: "x", Queue: "q", Type: "t", Payload: []byte{}, State: StateWaiting})
	base[1] = 2
	for name, tail := range map[string][]byte{
		"duplicate section": {'m', 4, 1, 1, 'k', 0, 'm', 4, 1, 1, 'j', 0},
		"duplicate key":     {'m', 7, 2, 1, 'k', 0, 1, 'k', 0},
		"empty section":     {'m', 1, 0},
		"short section":     {'m', 9, 1},
		"count too big":     {'m', 3, 9, 1, 'k'},
		"trailing in body":  {'m', 5, 1, 1, 'k', 0, 0},
	} {
		if _, err := DecodeRecord("x", append(append([]byte{}, base...), tail...)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestValidateMetadata(t *testing.T) {
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
