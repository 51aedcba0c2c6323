package measured

import "testing"

func TestReplaceBlock(t *testing.T) {
	page := []byte("a\n<!-- BEGIN GENERATED x -->\nold\n<!-- END GENERATED x -->\nb\n")
	got, ok := ReplaceBlock(page, "x", "new\n")
	if want := "a\n<!-- BEGIN GENERATED x -->\nnew\n<!-- END GENERATED x -->\nb\n"; !ok || string(got) != want {
		t.Fatalf("ReplaceBlock = %q, %v; want %q, true", got, ok, want)
	}
	if _, ok := ReplaceBlock(page, "y", "new\n"); ok {
		t.Fatal("ReplaceBlock found a block that is not there")
	}
}
