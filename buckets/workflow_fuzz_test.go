package buckets

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// flowSamples are records of every workflow part, for the fuzzer's seeds.
func flowSamples() []*Record {
	head := chainHead("c", 4)
	head.Flow.Next[1].Metadata = map[string]string{"k": "v"}
	head.Flow.Next[2].DelayMs = 1500
	head.Flow.Next[2].Priority, head.Flow.Next[1].PassResult, head.Flow.Next[1].Priority = 4, true, 2
	head.Priority = 3
	mid := chainHead("c", 3)
	mid.Flow = &Flow{ID: "c", Kind: FlowChain, Step: 1, Total: 3, Input: []byte("prev"), Cancelled: true,
		Next: mid.Flow.Next[1:]}
	_, members := groupRecs("g", 3, PolicyFail)
	cb := newRec(FlowCallbackID("g"), t0)
	cb.Flow = &Flow{ID: "g", Kind: FlowCallback, Total: 3, Input: []byte(`[{"index":0}]`)}
	return []*Record{head, mid, members[2], cb}
}

// FuzzDecodeFlow feeds DecodeRecord records with flow sections, mutated:
// it must never panic, must refuse what is not canonical, and what it
// accepts must round-trip.
func FuzzDecodeFlow(f *testing.F) {
	for _, r := range flowSamples() {
		enc := r.Encode()
		f.Add(enc)
		f.Add(enc[:len(enc)-1])
		f.Add(append(append([]byte{}, enc...), 0))
		body := r.Flow.encode()
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As a whole record.
		r, err := DecodeRecord("id", b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || r != nil {
				t.Fatalf("DecodeRecord: %v (record %v)", err, r != nil)
			}
		} else {
			enc := r.Encode()
			r2, err := DecodeRecord("id", enc)
			if err != nil || !reflect.DeepEqual(r, r2) || !bytes.Equal(enc, r2.Encode()) {
				t.Fatalf("round trip: %v\n first %+v\nsecond %+v", err, r, r2)
			}
		}
		// As a flow section's body.
		fl := decodeFlow(b)
		if fl == nil {
			return
		}
		enc := fl.encode()
		fl2 := decodeFlow(enc)
		if fl2 == nil || !reflect.DeepEqual(fl, fl2) || !bytes.Equal(enc, fl2.encode()) {
			t.Fatalf("flow round trip:\n first %+v\nsecond %+v", fl, fl2)
		}
	})
}

// TestFlowSamplesRoundTrip runs the round trip on the samples directly.
func TestFlowSamplesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range flowSamples() {
		got, err := DecodeRecord(r.ID, r.Encode())
		if err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		if !reflect.DeepEqual(got.Flow, r.Flow) {
			t.Fatalf("%s: flow\n got %+v\nwant %+v", r.ID, got.Flow, r.Flow)
		}
	}
}

// A flow section (the record's last: its body is short here, so its
// length is one byte) holding nonsense makes the record malformed.
func TestFlowSectionRequired(t *testing.T) {
	t.Parallel()
	r := chainHead("c", 2)
	enc := r.Encode()
	bad := append([]byte{}, enc[:len(enc)-len(r.Flow.encode())-2]...)
	bad = append(bad, sectionFlow, 1, 0xff)
	if _, err := DecodeRecord("x", bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("nonsense flow section: %v", err)
	}
}
