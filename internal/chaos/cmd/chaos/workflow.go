package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bucketq/bucketq/internal/chaos"
)

// runWorkflow runs the workflow scenario of o (its binary, seed, drain,
// directory, layout and progress) sized by spec
// ("CHAINSxSTEPS,GROUPSxMEMBERS") under every fault, writes its Markdown
// table to markdown when set, and returns the exit code.
func runWorkflow(ctx context.Context, o chaos.WorkflowOptions, spec, markdown string) int {
	o.KillEvery, o.RestartEvery, o.Cuts = 700*time.Millisecond, 2500*time.Millisecond, true
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, ",", " "), "%dx%d %dx%d", &o.Chains, &o.Steps, &o.Groups, &o.Members); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: -workflow %q: want CHAINSxSTEPS,GROUPSxMEMBERS, e.g. 2000x5,200x50\n", spec)
		return 2
	}
	rep, err := chaos.RunWorkflow(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: workflow: %v\n", err)
		return 1
	}
	fmt.Println(rep.String())
	if markdown != "" {
		cmd := "go run ./internal/chaos/cmd/chaos"
		flag.Visit(func(f *flag.Flag) {
			if f.Name != "markdown" && f.Name != "seed" && f.Name != "q" && f.Name != "keep" && f.Name != "dir" {
				cmd += fmt.Sprintf(" -%s %s", f.Name, f.Value)
			}
		})
		cmd += fmt.Sprintf(" -seed %d", o.Seed)
		if err := os.WriteFile(markdown, []byte(chaos.WorkflowMarkdown(cmd, []*chaos.WorkflowReport{rep})), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if !rep.OK() {
		fmt.Println("FAILED:\n  " + strings.Join(rep.Failures, "\n  "))
		return 1
	}
	return 0
}
