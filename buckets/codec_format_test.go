package buckets

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// A generated id carries the millisecond it was made in; IDTime reads it
// back, with or without a lane suffix, and refuses what is not an id of
// that shape.
func TestIDTime(t *testing.T) {
	t.Parallel()
	for _, ms := range []int64{1, 1700000000000, 1<<48 - 1} {
		id := NewID(ms)
		if len(id) != IDLen {
			t.Fatalf("NewID(%d) = %q: %d characters", ms, id, len(id))
		}
		for _, s := range []string{id, id + "~0", id + "~17"} {
			if got, ok := IDTime(s); !ok || got != ms {
				t.Fatalf("IDTime(%q) = %d, %v; want %d", s, got, ok, ms)
			}
		}
	}
	if a, b := NewID(1700000000000), NewID(1700000000000); a == b || a[:8] != b[:8] {
		t.Fatalf("two ids of one millisecond: %q and %q (want distinct, sharing the time's digits)", a, b)
	}
	if a, b := NewID(1700000000000), NewID(1700000000001); a >= b {
		t.Fatalf("a later millisecond's id sorts first: %q, %q", a, b)
	}
	for _, ms := range []int64{0, -5, 1 << 48} { // no time stored
		if got, ok := IDTime(NewID(ms)); ok {
			t.Fatalf("NewID(%d): IDTime says %d", ms, got)
		}
	}
	for _, s := range []string{"", "x", "order-7", NewID(5)[:IDLen-1], NewID(5) + "x", NewID(5) + "-1",
		"8000000000000000000000", "zzzzzzzzzzzzzzzzzzzzzz", "7n42DGM5Tflk9n8mt7Fhc8", "0000000000000000000000",
		"0f8fad5b-d9cb-469f-a165-70867728950e"} {
		if got, ok := IDTime(s); ok {
			t.Errorf("IDTime(%q) = %d, want none", s, got)
		}
	}
	// 2^128 − 1 is an id of the shape, its time the largest 48-bit value.
	if got, ok := IDTime("7n42DGM5Tflk9n8mt7Fhc7"); !ok || got != 1<<48-1 {
		t.Fatalf("IDTime(2^128−1) = %d, %v", got, ok)
	}
}

// A waiting task as a producer writes it with the engine's defaults: the
// header (all but its type and payload) is the magic, the version, one
// byte of state and mask and the due delta; its creation time is its id's.
func TestRecordSize(t *testing.T) {
	t.Parallel()
	created := int64(1700000000000)
	r := &Record{ID: idAt(created), Queue: "default", Type: "bench", Payload: bytes.Repeat([]byte("p"), 106),
		State: StateWaiting, MaxAttempts: 25, TimeoutMs: 1800000, Created: created, Due: created + 3600000}
	b := r.Encode()
	delta := len(binary.AppendVarint(nil, 3600000))
	if head := len(b) - len(r.Type) - len(r.Payload); head != 3+1+delta {
		t.Fatalf("header of %d bytes, want %d: %x", head, 4+delta, b[:len(b)-len(r.Payload)])
	}
	if len(b) > 124 {
		t.Fatalf("record of %d bytes: past the 128-byte allocation class with its 4 bytes of string header", len(b))
	}
	// Due now: no due delta either.
	r.Due = created
	if head := len(r.Encode()) - len(r.Type) - len(r.Payload); head != 4 {
		t.Fatalf("an immediate task's header: %d bytes, want 4", head)
	}
	// Under an id without its time, the creation time is stored.
	r.ID = "order-7"
	if head := len(r.Encode()) - len(r.Type) - len(r.Payload); head != 4+len(binary.AppendUvarint(nil, uint64(created))) {
		t.Fatalf("a chosen id's header: %d bytes", head)
	}
}

// Bytes Encode writes, checked by hand against the format (not made by
// Encode in the test, so that a change to the encoder and the decoder
// together cannot hide a break).
func TestRecordGolden(t *testing.T) {
	t.Parallel()
	id := idAt(1700000000000)
	waiting := &Record{ID: id, Queue: "default", Type: "noop", Payload: []byte("abc"), State: StateWaiting,
		MaxAttempts: 25, TimeoutMs: 1800000, Created: 1700000000000, Due: 1700000005000}
	retry := &Record{ID: "x", Queue: "mail", Type: "t", Payload: []byte{}, State: StateRetry, Attempts: 1,
		MaxAttempts: 3, TimeoutMs: 1800000, Created: 1700000000000, Due: 1700000000000, LastError: "e",
		Unique: "u"}
	for _, tc := range []struct {
		stored string
		want   *Record
	}{
		// 'B' 4, (CreatedID|Due)<<3 | waiting, zigzag 5000, "noop", "abc".
		{"4204" + "18" + "904e" + "046e6f6f70" + "616263", waiting},
		// 'B' 4, (Created|Queue|MaxAttempts|Attempts|LastError|Sections)<<3 | retry
		// (a 3-byte uvarint), created, "mail", 3, 1, "e", "t", the sections.
		{"4204" + "e1850c" + "80d095ffbc31" + "046d61696c" + "03" + "01" + "0165" + "0174" + "03" + "030175", retry},
	} {
		b, _ := hex.DecodeString(tc.stored)
		r, err := DecodeRecord(tc.want.ID, b)
		if err != nil {
			t.Fatalf("%s: %v", tc.stored, err)
		}
		if !reflect.DeepEqual(r, tc.want) {
			t.Fatalf("decoded\n %+v\nwant %+v", r, tc.want)
		}
		if enc := tc.want.Encode(); !bytes.Equal(enc, b) {
			t.Fatalf("Encode = %x, want %s", enc, tc.stored)
		}
	}
}

// A record has one encoding: a field stored at what its
// absence means, a creation time the id does not carry or one it does
// stored anyway, an unknown mask bit or state, and an empty sections block
// are refused; so is a required section this release does not know.
func TestRecordRejects(t *testing.T) {
	t.Parallel()
	id := idAt(1700000000000)
	created := binary.AppendUvarint(nil, 1700000000000)
	h := func(mask uint64, state byte) []byte { return binary.AppendUvarint(nil, mask<<3|uint64(state)) }
	rec := func(parts ...[]byte) []byte { return append([]byte{'B', 4}, bytes.Join(parts, nil)...) }
	typ := []byte{1, 't'}
	for name, tc := range map[string]struct {
		id string
		b  []byte
	}{
		"created from an id without time": {"order-7", rec(h(fCreatedID, 0), typ)},
		"created both ways":               {id, rec(h(fCreatedID|fCreated, 0), created, typ)},
		"created stored, id has it":       {id, rec(h(fCreated, 0), created, typ)},
		"created stored as 0":             {"x", rec(h(fCreated, 0), []byte{0}, typ)},
		"due delta 0":                     {"x", rec(h(fDue, 0), []byte{0}, typ)},
		"due before 0":                    {"x", rec(h(fDue, 0), []byte{1}, typ)}, // zigzag −1
		"default queue stored":            {"x", rec(h(fQueue, 0), []byte{7}, []byte("default"), typ)},
		"default attempts stored":         {"x", rec(h(fMaxAttempts, 0), []byte{25}, typ)},
		"default timeout stored":          {"x", rec(h(fTimeout, 0), binary.AppendUvarint(nil, 1800000), typ)},
		"zero attempts":                   {"x", rec(h(fAttempts, 0), []byte{0}, typ)},
		"empty worker":                    {"x", rec(h(fWorker, 0), []byte{0}, typ)},
		"unknown bit":                     {"x", rec(h(fKnown+1, 0), typ)},
		"state code 6":                    {"x", rec(h(0, 6), typ)},
		"state code 7":                    {"x", rec(h(0, 7), typ)},
		"empty sections":                  {"x", rec(h(fSections, 0), typ, []byte{0})},
		"sections past the end":           {"x", rec(h(fSections, 0), typ, []byte{9, 3, 1, 'u'})},
		"unknown required section":        {"x", rec(h(fSections, 0), typ, []byte{3, 30, 1, 'u'})},
		"no type":                         {"x", rec(h(0, 0))},
		"truncated mask":                  {"x", rec([]byte{0x80})},
	} {
		r, err := DecodeRecord(tc.id, tc.b)
		if err == nil {
			t.Errorf("%s: accepted as %+v", name, r)
		} else if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v does not wrap ErrMalformed", name, err)
		}
	}
	if _, err := DecodeRecord("x", rec(h(fKnown+1, 0), typ)); err == nil || !strings.Contains(err.Error(), "upgrade this worker") {
		t.Fatalf("unknown field: %v", err)
	}
	// What absence means: the defaults, and due at creation.
	r, err := DecodeRecord(id, rec(h(fCreatedID, 2), typ, []byte("pay")))
	if err != nil || r.Queue != "default" || r.MaxAttempts != 25 || r.TimeoutMs != 1800000 ||
		r.Created != 1700000000000 || r.Due != r.Created || r.State != StateRunning || string(r.Payload) != "pay" {
		t.Fatalf("defaults: %+v, %v", r, err)
	}
}

// Rewriting a record whose id carries a time it does not match, or that
// was made before ids carried one, keeps its own creation time.
func TestRecordKeepsCreated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id string }{{idAt(1700000000000)}, {idAt(1700000000000) + "~2"}, {"0f8fad5b-d9cb-469f-a165-70867728950e"}} {
		for _, created := range []int64{0, 1, 1699999999999, 1700000000000} {
			r := &Record{ID: tc.id, Queue: "q", Type: "t", Payload: []byte{}, State: StateWaiting, MaxAttempts: 1,
				TimeoutMs: 1, Created: created, Due: created + 10}
			got, err := DecodeRecord(tc.id, r.Encode())
			if err != nil || !reflect.DeepEqual(got, r) {
				t.Fatalf("id %s created %d: %+v, %v", tc.id, created, got, err)
			}
		}
	}
}
