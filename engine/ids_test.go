package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// A generated id is 22 base62 digits, of the shape generatedID knows, and
// 10,000 of them are distinct.
func TestNewIDFormat(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		id := newID()
		if len(id) != idLen {
			t.Fatalf("%q: %d characters, want %d", id, len(id), idLen)
		}
		for i := 0; i < len(id); i++ {
			if !strings.ContainsRune(base62, rune(id[i])) {
				t.Fatalf("%q: %q is not a base62 digit", id, id[i])
			}
		}
		if !generatedID(id) {
			t.Fatalf("%q is not recognised as generated", id)
		}
		if err := validateID(id); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("%q generated twice", id)
		}
		seen[id] = true
	}
}

// EncodeID is the base62 spelling of the 128-bit number, as math/big has it.
func TestEncodeID(t *testing.T) {
	t.Parallel()
	var cases [][16]byte
	cases = append(cases, [16]byte{}, [16]byte{15: 61}, [16]byte{15: 62})
	var ones [16]byte
	for i := range ones {
		ones[i] = 0xff
	}
	cases = append(cases, ones)
	for range 1000 {
		var b [16]byte
		_, _ = rand.Read(b[:])
		cases = append(cases, b)
	}
	for _, b := range cases {
		want := new(big.Int).SetBytes(b[:]).Text(62)
		// big's base 62 digits are 0-9a-zA-Z; this package's 0-9A-Za-z.
		want = strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z':
				return r - 'a' + 'A'
			case r >= 'A' && r <= 'Z':
				return r - 'A' + 'a'
			}
			return r
		}, want)
		want = strings.Repeat("0", idLen-len(want)) + want
		if got := buckets.EncodeID(b); got != want {
			t.Fatalf("EncodeID(%x) = %q, want %q", b, got, want)
		}
	}
}

// The digits of the largest and smallest 128-bit values bound the first
// digit that generatedID accepts.
func TestGeneratedIDShapes(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"0000000000000000000000":               true,
		"7n42DGM5Tflk9n8mt7Fhc7":               true, // 2^128 − 1
		"8000000000000000000000":               false,
		"0000000000000000000-00":               false,
		"000000000000000000000":                false,
		"0f8fad5b-d9cb-469f-a165-70867728950e": true, // an id of an earlier release
		"0f8fad5b-d9cb-469f-a165-70867728950x": false,
		"order-7":                              false,
	} {
		if got := generatedID(id); got != want {
			t.Errorf("generatedID(%q) = %v, want %v", id, got, want)
		}
	}
}

// Lanes: a generated id without a lane suffix is in lane 0, whichever its
// form (this release's or an earlier release's UUID); with "~k" in lane k;
// a reply task in its parent's lane.
func TestLaneOfGeneratedIDs(t *testing.T) {
	t.Parallel()
	for range 100 {
		id := newID()
		if got := laneOf(id, 8); got != 0 {
			t.Fatalf("%q: lane %d, want 0", id, got)
		}
		if got := laneOf(id+"~5", 8); got != 5 {
			t.Fatalf("%q~5: lane %d", id, got)
		}
		if got := laneOf(id+"~5~r1.17", 8); got != 5 {
			t.Fatalf("reply of %q~5: lane %d", id, got)
		}
		if id := laneTaskID(3, 8, time.Now().UnixMilli()); laneOf(id, 8) != 3 || !generatedID(strings.TrimSuffix(id, "~3")) {
			t.Fatalf("laneTaskID(3, 8) = %q", id)
		}
	}
	if got := laneOf("0f8fad5b-d9cb-469f-a165-70867728950e", 8); got != 0 {
		t.Errorf("an earlier release's UUID: lane %d, want 0", got)
	}
}

// Enqueue gives a task a short id; a task with an earlier release's id (a
// UUID, given here with TaskID) is found, cancelled and reported like any.
func TestEnqueueIDs(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	c := e.client(t)
	ti, err := c.Enqueue(ctx, "job", []byte("x"), In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(ti.ID) != idLen || !generatedID(ti.ID) {
		t.Errorf("generated id %q: want %d base62 digits", ti.ID, idLen)
	}
	if got, err := c.Lookup(ctx, ti.ID); err != nil || got.ID != ti.ID {
		t.Fatalf("Lookup(%q) = %v, %v", ti.ID, got, err)
	}
	const old = "0f8fad5b-d9cb-469f-a165-70867728950e"
	if _, err := c.Enqueue(ctx, "job", []byte("y"), TaskID(old), In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Lookup(ctx, old); err != nil || got.ID != old || string(got.Payload) != "y" {
		t.Fatalf("Lookup(%q) = %v, %v", old, got, err)
	}
	if err := c.Cancel(ctx, old); err != nil {
		t.Fatalf("Cancel(%q): %v", old, err)
	}
}

// A task's record starts with the magic byte and the version, 4; its
// creation time is its id's, not stored: the header is the magic, the
// version, state and mask, the due delta and the type. It is looked up and
// cancelled, and the cancelled record is the same version.
func TestTaskRecord(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	conn := e.admin(t)
	c := e.client(t)
	ti, err := c.Enqueue(ctx, "job", []byte("y"), In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	raw := func() []byte {
		b, err := redis.Bytes(conn.Do("GET", e.key("t:"+ti.ID)))
		if err != nil || len(b) < 3 {
			t.Fatalf("record of %s: %q, %v", ti.ID, b, err)
		}
		return b
	}
	if b := raw(); b[0] != 'B' || b[1] != 4 {
		t.Fatalf("record starts %q; want B and version 4", b[:2])
	}
	if created, ok := buckets.IDTime(ti.ID); !ok || created != ti.Created.UnixMilli() {
		t.Fatalf("id %s carries %d, %v; the task was created at %d", ti.ID, created, ok, ti.Created.UnixMilli())
	}
	if head := len(raw()) - len("y") - len("job"); head > 3+4+1 {
		t.Fatalf("the record's header is %d bytes: %x", head, raw())
	}
	got, err := c.Lookup(ctx, ti.ID)
	if err != nil || !bytes.Equal(got.Payload, ti.Payload) || got.Due.UnixMilli() != ti.Due.UnixMilli() {
		t.Fatalf("Lookup(%s) = %+v, %v; want %+v", ti.ID, got, err, ti)
	}
	if err := c.Cancel(ctx, ti.ID); err != nil {
		t.Fatalf("Cancel(%s): %v", ti.ID, err)
	}
	if v := raw()[1]; v != 4 {
		t.Errorf("the cancelled record is version %d, want 4", v)
	}
}
