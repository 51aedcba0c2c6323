package engine

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"

	"github.com/google/uuid"
)

// idLen is the length of a generated task id: 128 random bits in base 62
// (62^22 > 2^128), which is what a task costs in every key and list that
// names it; a canonical UUID spells the same bits in 36 characters.
const idLen = 22

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns a new random task id: 128 bits of crypto/rand as idLen
// base62 digits, most significant first, zero-padded.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return encodeID(b)
}

// encodeID spells 128 bits (big-endian) as idLen base62 digits.
func encodeID(b [16]byte) string {
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var out [idLen]byte
	for i := idLen - 1; i >= 0; i-- {
		var r uint64
		hi, r = hi/62, hi%62
		lo, r = bits.Div64(r, lo, 62)
		out[i] = base62[r]
	}
	return string(out[:])
}

// generatedID reports whether id has the shape of an id this package
// generates without a lane: newID's (22 base62 digits of at most 128
// bits) or a canonical UUID (what earlier releases generated).
func generatedID(id string) bool {
	switch len(id) {
	case idLen:
		// The largest 128-bit value in base 62 starts with '7'.
		if id[0] < '0' || id[0] > '7' {
			return false
		}
		for i := 0; i < len(id); i++ {
			if !isBase62(id[i]) {
				return false
			}
		}
		return true
	case 36:
		_, err := uuid.Parse(id)
		return err == nil
	}
	return false
}

func isBase62(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}
