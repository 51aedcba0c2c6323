package buckets

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

// The dispatch turn: one holder at a time, renewed by its holder, a
// turned-away dispatcher marked for the holder's end, which reads and
// clears the mark; an end by a dispatcher that no longer holds the turn
// changes nothing.
func TestDispatchTurn(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	take := func(id string, want bool) {
		t.Helper()
		got, err := s.TakeTurn(ctx, c, id, 5)
		if err != nil || got != want {
			t.Fatalf("TakeTurn(%s) = %v, %v; want %v", id, got, err, want)
		}
	}
	end := func(id string, want bool) {
		t.Helper()
		got, err := s.EndTurn(ctx, c, id)
		if err != nil || got != want {
			t.Fatalf("EndTurn(%s) = %v, %v; want missed %v", id, got, err, want)
		}
	}
	holder := func() string {
		t.Helper()
		h, err := redis.String(c.Do("GET", s.Keys.Turn()))
		if err != nil && err != redis.ErrNil {
			t.Fatal(err)
		}
		return h
	}

	take("a", true)
	if ttl, _ := redis.Int(c.Do("TTL", s.Keys.Turn())); ttl < 1 || ttl > 5 {
		t.Errorf("the turn's TTL is %d s; want 1 to 5", ttl)
	}
	take("a", true) // renewed
	end("b", false) // not b's: nothing changes
	if h := holder(); h != "a" {
		t.Fatalf("holder %q after another's end; want a", h)
	}
	end("a", false) // nobody was turned away
	if h := holder(); h != "" {
		t.Fatalf("holder %q after its end; want none", h)
	}

	take("a", true)
	take("b", false) // turned away: marked
	if ttl, _ := redis.Int(c.Do("TTL", s.Keys.TurnMissed())); ttl < 1 || ttl > 5 {
		t.Errorf("the mark's TTL is %d s; want 1 to 5", ttl)
	}
	end("a", true) // sees the mark, and clears it
	if n, _ := redis.Int(c.Do("EXISTS", s.Keys.TurnMissed())); n != 0 {
		t.Errorf("the mark outlived the end that read it")
	}
	take("b", true)
	end("b", false)

	// A turn key of the wrong type is an error the caller can tell.
	if _, err := c.Do("RPUSH", s.Keys.Turn(), "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeTurn(ctx, c, "a", 5); !IsWrongType(err) {
		t.Errorf("TakeTurn over a list: %v; want a wrong-type error", err)
	}
	if _, err := s.EndTurn(ctx, c, "a"); !IsWrongType(err) {
		t.Errorf("EndTurn over a list: %v; want a wrong-type error", err)
	}
}
