package engine

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Every token taken is given back once: take, tryTake, takeFree and
// takeWithin never hold more than there are, and give never returns more
// than were taken.
func TestTokens(t *testing.T) {
	t.Parallel()
	tk := newTokens(3)
	if !tk.take(context.Background()) || tk.out() != 1 {
		t.Fatalf("take: out %d, want 1", tk.out())
	}
	if n := tk.takeFree(1, 5); n != 3 || !tk.all() {
		t.Fatalf("takeFree to 5 of 3: holds %d, all %v; want 3, true", n, tk.all())
	}
	if tk.tryTake() {
		t.Fatal("tryTake took a fourth token of 3")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tk.take(ctx) {
		t.Fatal("take with every token out and an ended context took one")
	}
	expired := make(chan time.Time, 1)
	expired <- time.Now()
	if tk.takeBefore(context.Background(), expired) {
		t.Fatal("takeBefore with every token out and an expired timer took one")
	}
	tk.give(3)
	if tk.out() != 0 {
		t.Fatalf("out %d after every token went back", tk.out())
	}
	defer func() {
		if recover() == nil {
			t.Error("giving back a token not taken did not panic")
		}
	}()
	tk.give(1)
}

// takeWithin takes the tokens given back within its window, and stops
// waiting as soon as nobody else holds one.
func TestTokensTakeWithin(t *testing.T) {
	t.Parallel()
	tk := newTokens(4)
	tk.takeFree(0, 3) // others hold 3
	var wg sync.WaitGroup
	wg.Go(func() { tk.give(3) }) // all at once, as a group frees its slots
	others := func(n int) bool { return tk.out() > n }
	n := tk.takeWithin(0, 4, time.Minute, others)
	wg.Wait()
	if n != 4 || !tk.all() {
		t.Fatalf("took %d of 4 (all %v) while the others gave theirs back", n, tk.all())
	}
	tk.give(4)
	// Nobody else holds a token: no wait, whatever the window.
	if n := tk.takeWithin(0, 8, time.Hour, others); n != 4 {
		t.Fatalf("took %d, want the 4 free", n)
	}
}
