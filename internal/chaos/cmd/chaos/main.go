// Command chaos runs the engine's fault-injection scenarios against a
// redis-server it starts itself, and checks every task against the
// ledgers written by the producers and handlers (see package chaos and
// docs/reliability.md).
//
//	go run ./internal/chaos/cmd/chaos -scenario all -tasks 50000 -seed 42
//	go run ./internal/chaos/cmd/chaos -scenario workers,conncut -tasks 5000
//	go run ./internal/chaos/cmd/chaos -periodic 2m
//	go run ./internal/chaos/cmd/chaos -workflow 2000x5,200x50 -markdown workflow.md
//	go run ./internal/chaos/cmd/chaos -list
//	go run ./internal/chaos/cmd/chaos -tasks 2500 -seed 7 -markdown tables.md
//
// It prints each scenario's report, and exits 1 if any failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/internal/chaos"
	"github.com/bucketq/bucketq/internal/redistest"
)

func main() {
	var (
		scenario = flag.String("scenario", "all", "scenario name, a comma-separated list, or all")
		tasks    = flag.Int("tasks", 50000, "acknowledged tasks per scenario")
		seed     = flag.Int64("seed", 0, "random seed (0: pick one and print it)")
		duration = flag.Duration("duration", 0, "production time per scenario (default tasks/1500 s, at least 5 s)")
		delayMax = flag.Duration("delay-max", 0, "longest delay of a delayed task (0: 5s)")
		drain    = flag.Duration("drain", 60*time.Second, "longest wait for the last tasks after the faults stop")
		dir      = flag.String("dir", "", "work directory (default: a temporary one per scenario)")
		keep     = flag.Bool("keep", false, "keep the work directory of passing runs")
		race     = flag.Bool("race", false, "build the engine processes with the race detector")
		quiet    = flag.Bool("q", false, "no progress lines")
		list     = flag.Bool("list", false, "list the scenarios and exit")
		shards   = flag.Int("shards", 1, "run the scenarios (task, -periodic or -workflow) on this many lanes, each on a redis-server of its own (1: one server)")
		procArgs = flag.String("proc-args", "", "extra space-separated chaosproc flags for every process, e.g. -done-retention=-1s")
		periodic = flag.Duration("periodic", 0, "run the periodic scenario (3 skewed schedulers of an every-1s entry killed at random) for this long instead of the task scenarios")
		outage   = flag.Duration("periodic-outage", 30*time.Second, "with -periodic: then stop every scheduler this long and restart one (0: no outage)")
		markdown = flag.String("markdown", "", "write the reports as the Markdown tables of docs/reliability.md to this file")
		on24     = flag.Bool("on24", false, "run the task scenarios on the Redis 2.4 redis-server binary that $REDIS24_SERVER names, instead of redis-server 7")
		workflow = flag.String("workflow", "", "run the workflow scenario instead of the task scenarios: CHAINSxSTEPS,GROUPSxMEMBERS, e.g. 2000x5,200x50 (kills, cuts and redis-server restarts at once)")
	)
	flag.Parse()
	bin24 := ""
	if *on24 {
		if bin24 = os.Getenv(redistest.EnvBinary24); bin24 == "" {
			fmt.Fprintf(os.Stderr, "chaos: -on24 needs %s, the path of a Redis 2.4 redis-server\n", redistest.EnvBinary24)
			os.Exit(2)
		}
	}
	if *list {
		fmt.Print(chaos.Describe())
		return
	}
	names := chaos.Scenarios()
	if *scenario != "all" {
		names = strings.Split(*scenario, ",")
	}
	for _, n := range names {
		if _, err := chaos.LookupScenario(n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano()%1_000_000_000 + 1
	}
	fmt.Printf("chaos: seed %d (replay with -seed %d)\n", *seed, *seed)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tmp, err := os.MkdirTemp("", "chaosproc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer os.RemoveAll(tmp)
	bin, err := chaos.BuildProc(ctx, tmp, *race)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var progress *os.File
	if !*quiet {
		progress = os.Stderr
	}
	if *workflow != "" {
		o := chaos.WorkflowOptions{Bin: bin, Seed: uint64(*seed), Drain: *drain, Dir: *dir, Shards: *shards}
		if progress != nil {
			o.Log = progress
		}
		os.Exit(runWorkflow(ctx, o, *workflow, *markdown))
	}
	if *periodic > 0 {
		o := chaos.PeriodicOptions{Bin: bin, Duration: *periodic, Outage: *outage, Seed: uint64(*seed), Dir: *dir, Shards: *shards}
		if progress != nil {
			o.Log = progress
		}
		rep, err := chaos.RunPeriodic(ctx, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: periodic: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(rep.String())
		if !rep.OK() {
			fmt.Println("FAILED:\n  " + strings.Join(rep.Failures, "\n  "))
			os.Exit(1)
		}
		return
	}
	failed := 0
	var summary []string
	var reports []*chaos.Report
	for _, n := range names {
		o := chaos.Options{Scenario: n, Tasks: *tasks, Seed: *seed, Duration: *duration, DelayMax: *delayMax, Drain: *drain,
			Keep: *keep, Bin: bin, Race: *race, ProcArgs: strings.Fields(*procArgs), Shards: *shards, Redis24: bin24}
		if progress != nil {
			o.Log = progress
		}
		if *dir != "" {
			o.Dir = fmt.Sprintf("%s/%s", *dir, n)
		}
		rep, err := chaos.Run(ctx, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: scenario %s: %v\n", n, err)
			failed++
			summary = append(summary, fmt.Sprintf("%-10s ERROR %v", n, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		fmt.Println(rep)
		reports = append(reports, rep)
		verdict := "PASS"
		if !rep.OK() {
			failed++
			verdict = "FAIL"
		}
		summary = append(summary, fmt.Sprintf("%-10s %s  enqueued %d executed %d lost %d dead %d dup %d/%d interrupted early %d late-max %v",
			n, verdict, rep.Enqueued, rep.Executed, rep.Lost, rep.DeadLettered, rep.DupTasks, rep.InterruptedTasks, rep.Early, rep.LateMax))
	}
	fmt.Printf("chaos summary (seed %d):\n  %s\n", *seed, strings.Join(summary, "\n  "))
	if *markdown != "" {
		// The command that reproduces these tables: the seed always, the
		// other flags as given.
		cmd := "go run ./internal/chaos/cmd/chaos"
		flag.Visit(func(f *flag.Flag) {
			switch {
			case f.Name == "markdown" || f.Name == "seed" || f.Name == "q" || f.Name == "keep" || f.Name == "dir":
			case f.Name == "on24":
				cmd += " -on24" // a bool flag takes no value
			default:
				cmd += fmt.Sprintf(" -%s %s", f.Name, f.Value)
			}
		})
		cmd += fmt.Sprintf(" -seed %d", *seed)
		if err := os.WriteFile(*markdown, []byte(chaos.Markdown(cmd, reports)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
}
