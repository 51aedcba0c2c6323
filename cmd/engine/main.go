// Command engine runs and manages bucketq tasks on Redis 2.4 or newer.
//
//	engine run        dispatcher, reaper and workers, per config.yaml
//	engine enqueue    add a task
//	engine cancel     cancel a task that has not started
//	engine lookup     show a task
//	engine stats      per-queue figures, once or refreshed (--watch)
//	engine dead       list, retry or purge dead letters
//	engine demo       a self-contained demonstration on an in-memory Redis
//	engine version    print the version
//
// Run "engine help" or "engine CMD --help" for every flag, and see
// docs/operations.md for running it in production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/bucketq/bucketq/engine"
)

// Exit codes.
const (
	exitOK       = 0 // success, or a graceful stop on a signal
	exitFailure  = 1 // Redis unreachable, an operation failed, the demo found a problem
	exitUsage    = 2 // bad flags or config, or Redis refused the password or database
	exitNotFound = 3 // no such task (or no such dead letter)
	exitRefused  = 4 // the task is in a state that does not allow it
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
}

// run is the whole program: main only adds signal handling and os.Exit.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, environ: os.Environ()}
	return a.main(ctx, args)
}

type command struct {
	name, synopsis string
	run            func(a *app, ctx context.Context, args []string) int
}

func commands() []command {
	return []command{
		{"run", "run the dispatcher, reaper and workers (per config and --roles)", (*app).cmdRun},
		{"enqueue", "add a task; prints its id", (*app).cmdEnqueue},
		{"cancel", "cancel a task that has not started", (*app).cmdCancel},
		{"lookup", "show a task's state and times", (*app).cmdLookup},
		{"stats", "show per-queue figures (--watch to refresh)", (*app).cmdStats},
		{"dead", "list, retry or purge dead letters", (*app).cmdDead},
		{"demo", "run a demonstration on an in-memory Redis", (*app).cmdDemo},
		{"version", "print the version", (*app).cmdVersion},
		{"help", "explain a command: engine help CMD", (*app).cmdHelp},
	}
}

func (a *app) main(ctx context.Context, args []string) int {
	if len(args) == 0 {
		a.usage(a.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		a.usage(a.stdout)
		return exitOK
	case "-version", "--version":
		name = "version"
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(a, ctx, args[1:])
		}
	}
	fmt.Fprintf(a.stderr, "engine: unknown command %q\n\n", name)
	a.usage(a.stderr)
	return exitUsage
}

func (a *app) usage(w io.Writer) {
	fmt.Fprintf(w, "engine runs and manages bucketq tasks on Redis (2.4 or newer).\n\nUsage: engine COMMAND [flags] [args]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.synopsis)
	}
	fmt.Fprintf(w, `
Every command that talks to Redis reads the config file named by
--config or $%s (defaults apply without one), then ENGINE_*
environment variables, then flags. "engine CMD --help" lists a command's
flags; config.yaml at the repository root documents every setting and
docs/operations.md the rest.

Exit codes: 0 ok, 1 failure, 2 usage or config error (including a refused
password), 3 no such task, 4 the task's state does not allow it.
`, envConfig)
}

func (a *app) cmdHelp(ctx context.Context, args []string) int {
	if len(args) == 0 {
		a.usage(a.stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] && c.name != "help" {
			return c.run(a, ctx, append(args[1:], "--help"))
		}
	}
	fmt.Fprintf(a.stderr, "engine help: unknown command %q\n", args[0])
	return exitUsage
}

// newFlags returns a flag set whose usage shows synopsis, text and every
// flag, on stdout when asked for with --help.
func (a *app) newFlags(name, synopsis, text string) *flag.FlagSet {
	fs := flag.NewFlagSet("engine "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: engine %s %s\n\n%s\n", name, synopsis, strings.TrimSpace(text))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses flags wherever they appear among the arguments (the flag
// package stops at the first argument that is not a flag) and returns the
// others. ok is false when the command should end with code. --help
// prints the usage on stdout; a bad flag is reported on stderr with a
// pointer to --help.
func (a *app) parse(fs *flag.FlagSet, args []string) (pos []string, code int, ok bool) {
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(a.stdout)
				usage()
				return nil, exitOK, false
			}
			fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", fs.Name())
			return nil, exitUsage, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// fail prints err and returns the exit code it calls for.
func (a *app) fail(cmd string, err error) int {
	code := exitFailure
	var ce *ConfigError
	var re *refusedError
	switch {
	case errors.As(err, &re):
		fmt.Fprintf(a.stderr, "engine %s: %v\n  (%s)\n", cmd, err, re.hint())
		return exitUsage
	case errors.As(err, &ce), errors.Is(err, engine.ErrInvalidOption), errors.Is(err, engine.ErrInvalidName),
		errors.Is(err, engine.ErrPayloadTooLarge):
		code = exitUsage
	case errors.Is(err, engine.ErrNotFound):
		code = exitNotFound
	case errors.Is(err, engine.ErrAlreadyRunning), errors.Is(err, engine.ErrAlreadyDone), errors.Is(err, engine.ErrNotDead):
		code = exitRefused
	}
	msg := strings.ReplaceAll(err.Error(), "engine: ", "")
	if strings.Contains(msg, "\n") {
		msg = "\n  " + strings.ReplaceAll(msg, "\n", "\n  ")
	}
	fmt.Fprintf(a.stderr, "engine %s: %s\n", cmd, msg)
	return code
}
