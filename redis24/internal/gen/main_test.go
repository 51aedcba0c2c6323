package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestGeneratedFileIsCurrent fails when commands_gen.go was not regenerated
// after commands.txt changed (run go generate ./redis24/).
func TestGeneratedFileIsCurrent(t *testing.T) {
	src, err := os.Open("../../commands.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	names, err := parse(src)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate(names)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../commands_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("redis24/commands_gen.go is stale: run go generate ./redis24/")
	}
}

func TestParseRejectsBadInput(t *testing.T) {
	for _, in := range []string{"", "get\nget\n", "GET\n", "config get\n"} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q) succeeded, want an error", in)
		}
	}
	names, err := parse(strings.NewReader("# comment\n\nget\n set \n"))
	if err != nil || len(names) != 2 || names[1] != "set" {
		t.Errorf("parse = %v, %v", names, err)
	}
}
