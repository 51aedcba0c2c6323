package buckets

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"testing"
)

// compact turns WriteCompactRecords on for the test.
func compact(t *testing.T) {
	WriteCompactRecords(true)
	t.Cleanup(func() { WriteCompactRecords(false) })
}

func encodeLegacy(r *Record) []byte { return r.encodeLegacy() }

// Records of earlier releases (versions 1 to 3) decode to the same
// record as its version 4 encoding, and rewriting one writes version 4.
func TestRecordLegacyDecode(t *testing.T) {
	compact(t)
	for i, r := range append(sampleRecords(), sample()) {
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		for _, old := range [][]byte{encodeLegacy(r), r.encode3()} {
			got, err := DecodeRecord(r.ID, old)
			if err != nil {
				t.Fatalf("record %d (version %d): %v", i, old[1], err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Errorf("record %d (version %d):\n got %+v\nwant %+v", i, old[1], got, r)
			}
			// Not always shorter than version 3: these samples leave
			// fields unset that a producer always sets (max attempts,
			// timeout), which version 4 then stores as 0.
			if enc := got.Encode(); enc[1] != recordVersion4 || len(enc) > len(encodeLegacy(r)) {
				t.Errorf("record %d rewritten as version %d, %d bytes (was %d)", i, enc[1], len(enc), len(old))
			}
		}
	}
}

// Bytes an earlier release's Encode wrote (not made by encodeLegacy, so
// that a change to both cannot hide a break): a waiting task (version 1)
// and a retrying one with a unique key and metadata (version 2).
func TestRecordLegacyGolden(t *testing.T) {
	waiting := &Record{ID: "x", Queue: "default", Type: "noop", Payload: []byte("abc"), State: StateWaiting,
		MaxAttempts: 25, TimeoutMs: 1800000, Created: 1700000000000, Due: 1700000005000}
	retry := sample()
	retry.Metadata, retry.Unique = map[string]string{"k": "v"}, "u"
	for _, tc := range []struct {
		stored string
		want   *Record
	}{
		{"42017700000019c0ee6d80d095ffbc3188f795ffbc310000000764656661756c74046e6f6f70000003616263", waiting},
		{"42027202010419b0ea0180d095ffbc3188f795ffbc31e8d795ffbc310098c297ffbc31046d61696c0c73656e642e77656c636f6d65017704626f6f6d0c7b22746f223a22614062227d0301756d0501016b0176", retry},
	} {
		b, _ := hex.DecodeString(tc.stored)
		r, err := DecodeRecord("id", b)
		if err != nil {
			t.Fatal(err)
		}
		r.ID = tc.want.ID
		if !reflect.DeepEqual(r, tc.want) {
			t.Fatalf("decoded\n %+v\nwant %+v", r, tc.want)
		}
		if !bytes.Equal(encodeLegacy(tc.want), b) {
			t.Fatalf("encodeLegacy differs from the stored bytes: %x", encodeLegacy(tc.want))
		}
	}
}

// Version 3 is smaller: a waiting task's header (all but queue, type and
// payload) goes from 40 bytes to 30, a running one's shrinks too.
func TestRecordVersion3Size(t *testing.T) {
	r := &Record{ID: "x", Queue: "default", Type: "noop", Payload: []byte("abc"), State: StateWaiting,
		MaxAttempts: 25, TimeoutMs: 1800000, Created: 1700000000000, Due: 1700003600000}
	head := func(b []byte) int { return len(b) - len(r.Queue) - len(r.Type) - len(r.Payload) }
	v1, v3 := encodeLegacy(r), r.encode3()
	if v3[0] != 'B' || v3[1] != recordVersion3 || v3[2] != byte(StateWaiting) {
		t.Fatalf("version 3 starts %q", v3[:3])
	}
	if head(v3) >= head(v1) || head(v3) > 30 {
		t.Fatalf("header of %d bytes, was %d", head(v3), head(v1))
	}
	run := sample()
	if len(run.encode3()) >= len(encodeLegacy(run)) {
		t.Fatalf("a running task's record grows: %d bytes, was %d", len(run.encode3()), len(encodeLegacy(run)))
	}
}

// Version 3 has one encoding per record: a field the mask names with a
// zero value, an unknown mask bit, an empty worker and a due time before
// 1 are refused.
func TestRecordVersion3Rejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"zero attempts":   {'B', 3, 'w', fieldAttempts, 0, 1, 'q', 1, 't', 0},
		"unknown bit":     {'B', 3, 'w', 0x80, 0x40, 1, 'q', 1, 't', 0},
		"empty worker":    {'B', 3, 'w', 0x80, fieldWorker >> 7, 0, 1, 'q', 1, 't', 0},
		"due before 1":    {'B', 3, 'w', fieldCreated | fieldDue, 10, 19, 1, 'q', 1, 't', 0}, // 10 + (−10)
		"truncated delta": {'B', 3, 'w', fieldDue, 0x80},
		"no payload":      {'B', 3, 'w', 0, 1, 'q', 1, 't'},
	} {
		if _, err := DecodeRecord("x", b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := []byte{'B', 3, 'w', fieldCreated | fieldDue, 10, 0, 1, 'q', 1, 't', 0} // due == created
	if r, err := DecodeRecord("x", ok); err != nil || r.Due != 10 || r.Created != 10 {
		t.Fatalf("due equal to created: %+v, %v", r, err)
	}
}

// Encode writes what earlier releases read until WriteCompactRecords is
// turned on, and version 4 after; both decode to the record. A Store
// with Compact writes version 4 while the process-wide switch is off.
func TestWriteCompactRecords(t *testing.T) {
	r := sample()
	if b := r.Encode(); b[1] != recordVersion {
		t.Fatalf("default: version %d, want %d", b[1], recordVersion)
	}
	if b := (&Store{Compact: true}).EncodeRecord(r); b[1] != recordVersion4 {
		t.Fatalf("Store.Compact: version %d, want %d", b[1], recordVersion4)
	}
	if b := (&Store{}).EncodeRecord(r); b[1] != recordVersion {
		t.Fatalf("Store without Compact: version %d, want %d", b[1], recordVersion)
	}
	compact(t)
	if b := r.Encode(); b[1] != recordVersion4 {
		t.Fatalf("compact: version %d, want %d", b[1], recordVersion4)
	}
	if b := (&Store{}).EncodeRecord(r); b[1] != recordVersion4 {
		t.Fatalf("WriteCompactRecords, Store without Compact: version %d, want %d", b[1], recordVersion4)
	}
	for i, r := range append(sampleRecords(), r) {
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		if got, err := DecodeRecord(r.ID, r.Encode()); err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("record %d decoded\n %+v, %v\nwant %+v", i, got, err, r)
		}
	}
}
