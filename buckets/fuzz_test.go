package buckets

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// sampleRecords are records of every state and shape, for the seed corpus.
func sampleRecords() []*Record {
	return []*Record{
		{ID: "x", Queue: "default", Type: "noop", Payload: []byte{}, State: StateWaiting, MaxAttempts: 25,
			TimeoutMs: 1800000, Created: 1700000000000, Due: 1700000000000},
		{ID: "x", Queue: "q.1-_", Type: "email:send", Payload: []byte("batch:p0.1.7:3 padding"), State: StateRunning,
			Attempts: 2, Recoveries: 1, Runs: 4, MaxAttempts: 3, TimeoutMs: 5000, Created: 1, Due: 2, Started: 3,
			Deadline: 4, Worker: "0b7c7e5e-8a1a-4e32-9d7a-3f1f3b7f1a2c"},
		{ID: "x", Queue: "default", Type: "?", Payload: []byte("garbage\x00\xff"), State: StateDead, MaxAttempts: 1,
			Finished: 1 << 52, LastError: "task record missing"},
		{ID: "x", Queue: "d", Type: "t", State: StateDone, Payload: []byte{}, Attempts: 1<<31 - 1, MaxAttempts: 1<<31 - 1},
		{ID: "x", Queue: "d", Type: "ü", State: StateRetry, Payload: bytes.Repeat([]byte{0}, 300), LastError: "boom\npanic"},
		{ID: "x", Queue: "d", Type: "t", State: StateCancelled, Payload: []byte{}},
		{ID: "x", Queue: "d", Type: "t", State: StateWaiting, Payload: []byte("p"), MaxAttempts: 1, TimeoutMs: 1,
			Metadata: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k": ""}},

		{ID: "x", Queue: "d", Type: "t", State: StateWaiting, Payload: []byte("p"), Periodic: "nightly report",
			SkipIfRunning: true, Due: 1774746000000},
		{ID: "x", Queue: "d", Type: "t", State: StateCancelled, Payload: []byte{}, Periodic: "e"},

		{ID: "x", Queue: "d", Type: "t", State: StateWaiting, Payload: []byte("p"), MaxAttempts: 1,
			Unique: "d:0123456789abcdef0123456789abcdef", UniqueTTL: 600, ReplyTo: "replies"},
		{ID: "x", Queue: "d", Type: "t", State: StateRunning, Payload: []byte{}, Unique: "k:key"},
		{ID: "x", Queue: "mail", Type: "t", State: StateRunning, Payload: []byte("p"), Runs: 1, Worker: "w", HoldsSlot: true},
		{ID: "x", Queue: "d", Type: "t", State: StateRunning, Payload: []byte{}, Periodic: "e", SkipIfRunning: true, HoldsSlot: true},
		{ID: "x", Queue: "d", Type: "t", State: StateDone, Payload: []byte{}, ReplyTo: "r"},
		{ID: "x", Queue: "d", Type: "t", State: StateWaiting, Payload: []byte("p"), Snoozes: 7, Runs: 7, Due: 5, ExpireAt: 1774746000000},

		{ID: "x", Queue: "d", Type: "t", State: StateRetry, Payload: []byte("p"), Priority: 3, Snoozes: 1,
			Metadata: map[string]string{"k": "v"}},
		{ID: "x", Queue: "d", Type: "t", State: StateWaiting, Payload: []byte{}, Priority: MaxLevel},
	}
}

// FuzzDecodeRecord checks that DecodeRecord never panics, refuses with
// ErrMalformed, and that whatever it accepts survives a round trip:
// decode, encode, decode gives the same record, and encoding that gives
// the same bytes. The seeds (testdata/fuzz/FuzzDecodeRecord and below)
// run in every `go test`; fuzz with
//
//	go test ./buckets -run '^$' -fuzz FuzzDecodeRecord -fuzztime 30s
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		enc := r.Encode()
		f.Add(enc)
		f.Add(enc[:len(enc)-len(r.Payload)-1]) // cut in the type or the sections
		r.ID = fuzzIDs[1]
		f.Add(r.Encode())
	}
	for _, b := range []string{"", "B", "B\x04", "B\x04\x00", "B\x04\x07\x01t", "B\x03\x00\x01t", "garbage",
		"B\x04\x80\x00\x01t", "B\x04\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00"} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, id := range fuzzIDs {
			fuzzRecord(t, id, b)
		}
	})
}

// fuzzIDs are the ids the fuzzer decodes under: one without a time, one
// a generated id with its time, and that one with a lane suffix (a record
// reads the creation time from the last two).
var fuzzIDs = []string{"id", idAt(1700000000000), idAt(1700000000000) + "~3"}

// idAt is a generated id of Unix millisecond ms with fixed random bits,
// so that a test's ids are the same in every run.
func idAt(ms int64) string {
	b := [16]byte{6: 0x5e, 15: 0x17}
	b[0], b[1], b[2], b[3], b[4], b[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	return EncodeID(b)
}

// fuzzRecord is FuzzDecodeRecord's check of b as the record of task id.
func fuzzRecord(t *testing.T, id string, b []byte) {
	r, err := DecodeRecord(id, b)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("DecodeRecord error does not wrap ErrMalformed: %v", err)
		}
		if r != nil {
			t.Fatalf("DecodeRecord returned a record with its error")
		}
		return
	}
	if r.ID != id || r.Payload == nil {
		t.Fatalf("decoded record: id %q, payload nil %v", r.ID, r.Payload == nil)
	}
	enc := r.Encode()
	r2, err := DecodeRecord(id, enc)
	if err != nil {
		t.Fatalf("re-encoded record does not decode: %v\ninput %q\nencoded %q", err, b, enc)
	}
	if !reflect.DeepEqual(r, r2) {
		t.Fatalf("round trip changed the record:\n first %+v\nsecond %+v", r, r2)
	}
	if enc2 := r2.Encode(); !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding is not stable:\n%q\n%q", enc, enc2)
	}
}

// TestRecordRoundTrip runs the round trip on the sample records directly.
func TestRecordRoundTripSamples(t *testing.T) {
	t.Parallel()
	for i, r := range sampleRecords() {
		got, err := DecodeRecord(r.ID, r.Encode())
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		if !reflect.DeepEqual(r, got) {
			t.Errorf("record %d: round trip\n want %+v\n  got %+v", i, r, got)
		}
	}
}
