// Command engine runs and manages bucketq tasks on Redis 2.4 or newer.
//
// Build it with "go build -o bin/engine ./cmd/engine" from the repository
// root.
//
//	engine run        dispatcher, reaper and workers, per config.yaml
//	engine enqueue    add a task
//	engine cancel     cancel a task that has not started
//	engine lookup     show a task
//	engine stats      per-queue figures, once or refreshed (--watch)
//	engine dead       list, retry or purge dead letters
//	engine demo       a self-contained demonstration on an in-memory Redis
//	engine version    print the version
//	engine completion shell completion scripts (bash, zsh, fish, powershell)
//
// Run "engine help" or "engine CMD --help" for every flag, and see
// docs/operations.md for running it in production.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	// The time zone database, so that periodic entries' tz works on
	// hosts and containers without one.
	_ "time/tzdata"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/gomodule/redigo/redis"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK       = 0 // success, or a graceful stop on a signal
	exitFailure  = 1 // Redis unreachable, an operation failed, the demo found a problem
	exitUsage    = 2 // bad flags or config, or Redis refused the password or database
	exitNotFound = 3 // no such task (or no such dead letter)
	exitRefused  = 4 // the task is in a state that does not allow it
	exitExists   = 5 // enqueue --id: a task with that id exists already; nothing was written
	exitFindings = 6 // check: findings remain

	exitDuplicate    = 7  // enqueue --unique/--unique-key: another task holds the key; nothing was written
	exitWaitDead     = 8  // enqueue --wait: the task died (its last attempt failed)
	exitWaitCanceled = 9  // enqueue --wait: the task was cancelled
	exitWaitTimeout  = 10 // enqueue --wait: --wait-timeout passed before the task ended
)

const envConfig = "ENGINE_CONFIG"

func main() {
	ctx, stop := signalContext()
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// forceKey carries, in run's context, a context that ends on the second
// signal: "stop now, giving running tasks back".
type forceKey struct{}

// withForce attaches force to ctx for run.
func withForce(ctx, force context.Context) context.Context {
	return context.WithValue(ctx, forceKey{}, force)
}

// forceOf returns the force context attached to ctx, or one that never ends.
func forceOf(ctx context.Context) context.Context {
	if f, ok := ctx.Value(forceKey{}).(context.Context); ok {
		return f
	}
	return context.Background()
}

// signalContext ends its context on the first SIGINT or SIGTERM and its
// force context on the second; a third exits at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	force, forceCancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 3)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		n := 0
		for sig := range ch {
			n++
			switch n {
			case 1:
				cancel()
			case 2:
				forceCancel()
			default:
				fmt.Fprintf(os.Stderr, "engine: %v again: exiting now; a reaper will recover running tasks\n", sig)
				os.Exit(exitFailure)
			}
		}
	}()
	return withForce(ctx, force), func() {
		signal.Stop(ch)
		cancel()
		forceCancel()
	}
}

// app is one invocation: its streams and environment.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	environ        []string
	// testPools, when set, is told the workers' pool and the HTTP side's
	// pool of `engine run --http` (tests).
	testPools func(workers, http *redis.Pool)
}

// run is the whole program: main only adds signal handling and os.Exit.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, environ: os.Environ()}
	return a.main(ctx, args)
}

// exitCode ends a command with that code; its message was printed already.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// newRootCmd is the command tree. Each command group lives in its own
// file with its constructor (newRunCmd in cmd_run.go, ...).
func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "engine",
		Short: "engine runs and manages bucketq tasks on Redis (2.4 or newer)",
		Long: `engine runs and manages bucketq tasks on Redis (2.4 or newer).

Every command that talks to Redis reads the config file named by --config
or $` + envConfig + ` (defaults apply without one), then ENGINE_* environment
variables, then flags. config.yaml at the repository root documents every
setting, docs/operations.md the rest.

Exit codes: 0 ok, 1 failure, 2 usage or config error (including a refused
password), 3 no such task, 4 the task's state does not allow it, 5 the
--id exists, 6 check findings, 7 a unique duplicate, 8/9/10 enqueue --wait:
dead, cancelled, timed out.`,
		Version:       versionString(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetVersionTemplate("engine {{.Version}} " + runtime.Version() + "\n")
	root.AddCommand(a.newRunCmd(), a.newEnqueueCmd(), a.newCancelCmd(), a.newLookupCmd(), a.newCheckCmd(),
		a.newStatsCmd(), a.newDeadCmd(), a.newQueueCmd(), a.newPeriodicCmd(), a.newDemoCmd(), a.newVersionCmd(), a.newDashboardCmd(),
		a.newWorkflowCmd(), a.newShardsCmd())
	root.AddCommand(a.newInspectCmds()...)
	groupCommands(root)
	return root
}

// commandGroups lists the commands in the groups engine help shows, as
// a user looks for them: by what they act on.
var commandGroups = []struct {
	id, title string
	names     []string
}{
	{"tasks", "Tasks:", []string{"enqueue", "lookup", "cancel", "tasks", "dead", "workflow"}},
	{"queues", "Queues, workers and schedules:", []string{"queues", "stats", "queue", "workers", "periodic"}},
	{"run", "Running:", []string{"run", "dashboard", "demo"}},
	{"ops", "Operations:", []string{"check", "shards", "storage", "version"}},
}

// groupCommands puts root's commands in commandGroups; help and
// completion go with the operations.
func groupCommands(root *cobra.Command) {
	group := map[string]string{}
	for _, g := range commandGroups {
		root.AddGroup(&cobra.Group{ID: g.id, Title: g.title})
		for _, n := range g.names {
			group[n] = g.id
		}
	}
	for _, c := range root.Commands() {
		c.GroupID = group[c.Name()]
	}
	root.SetHelpCommandGroupID("ops")
	root.SetCompletionCommandGroupID("ops")
}

func (a *app) main(ctx context.Context, args []string) int {
	// Everything on stderr is messages (errors, logs) that may repeat task
	// data: no control or bidirectional character reaches the terminal.
	a.stderr = safetext.Writer(a.stderr)
	root := a.newRootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var code exitCode
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return int(code)
	}
	// Cobra's own errors: an unknown command or flag, wrong arguments.
	fmt.Fprintf(a.stderr, "%s: %v\nRun '%s --help' for usage.\n", cmd.CommandPath(), err, cmd.CommandPath())
	return exitUsage
}

// usageError reports a misuse of cmd: exit code 2.
func (a *app) usageError(cmd *cobra.Command, format string, args ...any) error {
	fmt.Fprintf(a.stderr, "%s: %s\n", cmd.CommandPath(), fmt.Sprintf(format, args...))
	return exitCode(exitUsage)
}

// fail prints err and returns the exit code it calls for.
func (a *app) fail(cmd string, err error) error {
	code := exitFailure
	var ce *ConfigError
	var re *refusedError
	switch {
	case errors.As(err, &re):
		fmt.Fprintf(a.stderr, "engine %s: %v\n  (%s)\n", cmd, err, re.hint())
		return exitCode(exitUsage)
	case errors.As(err, &ce), errors.Is(err, engine.ErrInvalid),
		errors.Is(err, engine.ErrTooLarge):
		code = exitUsage
	case errors.Is(err, engine.ErrNotFound):
		code = exitNotFound
	case errors.Is(err, engine.ErrTaskExists):
		code = exitExists
	case errors.Is(err, engine.ErrDuplicate):
		code = exitDuplicate
	case errors.Is(err, engine.ErrAlreadyRunning), errors.Is(err, engine.ErrAlreadyDone), errors.Is(err, errNotDead):
		code = exitRefused
	}
	msg := strings.ReplaceAll(err.Error(), "engine: ", "")
	if strings.Contains(msg, "\n") {
		msg = "\n  " + strings.ReplaceAll(msg, "\n", "\n  ")
	}
	fmt.Fprintf(a.stderr, "engine %s: %s\n", cmd, msg)
	if errors.Is(err, engine.ErrUncertain) {
		fmt.Fprintf(a.stderr, "  (the task may or may not have been written: run the same command again with the same --id)\n")
	}
	return exitCode(code)
}
