package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
)

func (a *app) cmdEnqueue(ctx context.Context, args []string) int {
	fs := a.newFlags("enqueue", "--type TYPE [flags]", `
Adds a task and prints its id. The payload is --payload, or stdin with
--payload - (or with no --payload when stdin is not a terminal). Without
--in or --at the task is due now.`)
	c := addCommon(fs)
	queue := fs.String("queue", "", "queue `name` (default: default_queue)")
	typ := fs.String("type", "", "task `type` (required): names the handler")
	payload := fs.String("payload", "", "payload `text`, or - for stdin")
	in := fs.Duration("in", 0, "due this long from now, e.g. 30s")
	at := fs.String("at", "", "due at this RFC 3339 `time`, e.g. 2030-01-02T15:04:05Z")
	maxAttempts := fs.Int("max-attempts", 0, "failed runs before the dead letters (default: default_max_attempts)")
	timeout := fs.Duration("timeout", 0, "bound on one run (default: default_timeout)")
	pos, code, ok := a.parse(fs, args)
	if !ok {
		return code
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	usage := func(format string, args ...any) int {
		fmt.Fprintf(a.stderr, "engine enqueue: "+format+"\n", args...)
		return exitUsage
	}
	switch {
	case len(pos) > 0:
		return usage("unexpected argument %q", pos[0])
	case *typ == "":
		return usage("--type is required")
	case given["in"] && given["at"]:
		return usage("give --in or --at, not both")
	case *in < 0:
		return usage("--in %v: want 0 or more", *in)
	}
	var opts []engine.Option
	if *queue != "" {
		opts = append(opts, engine.Queue(*queue))
	}
	if given["max-attempts"] {
		opts = append(opts, engine.MaxAttempts(*maxAttempts))
	}
	if given["timeout"] {
		opts = append(opts, engine.Timeout(*timeout))
	}
	switch {
	case given["in"]:
		opts = append(opts, engine.In(*in))
	case given["at"]:
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return usage("--at %q: want RFC 3339, e.g. 2030-01-02T15:04:05Z", *at)
		}
		opts = append(opts, engine.At(t))
	}
	body := []byte(*payload)
	if *payload == "-" || (!given["payload"] && !isTerminal(a.stdin)) {
		var err error
		if body, err = io.ReadAll(a.stdin); err != nil {
			return a.fail("enqueue", fmt.Errorf("read payload from stdin: %w", err))
		}
	}
	s, code := a.connect("enqueue", c)
	if s == nil {
		return code
	}
	defer s.close()
	info, err := s.client.Enqueue(ctx, *typ, body, opts...)
	if err != nil {
		return a.fail("enqueue", err)
	}
	fmt.Fprintln(a.stdout, info.ID)
	return exitOK
}

// isTerminal reports whether r is a terminal (or /dev/null, also a
// character device): then no payload is read from it.
func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	if !ok {
		return r == nil
	}
	st, err := f.Stat()
	return err != nil || st.Mode()&os.ModeCharDevice != 0
}

func (a *app) cmdCancel(ctx context.Context, args []string) int {
	fs := a.newFlags("cancel", "ID", `
Cancels a task that has not started: it will not run. Exits 3 if there is
no such task, 4 if it is running or finished already.`)
	c := addCommon(fs)
	id, code, ok := a.oneID(fs, args, "cancel")
	if !ok {
		return code
	}
	s, code := a.connect("cancel", c)
	if s == nil {
		return code
	}
	defer s.close()
	if err := s.client.Cancel(ctx, id); err != nil {
		return a.fail("cancel", err)
	}
	fmt.Fprintf(a.stdout, "cancelled %s\n", id)
	return exitOK
}

func (a *app) cmdLookup(ctx context.Context, args []string) int {
	fs := a.newFlags("lookup", "ID [--json]", `
Shows a task's state (scheduled, ready, running, retrying, done, dead,
cancelled), attempts and times. Done and cancelled tasks are kept for
done_retention, dead ones for dead_retention. Exits 3 if not found.`)
	c := addCommon(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	id, code, ok := a.oneID(fs, args, "lookup")
	if !ok {
		return code
	}
	s, code := a.connect("lookup", c)
	if s == nil {
		return code
	}
	defer s.close()
	ti, err := s.client.Lookup(ctx, id)
	if err != nil {
		return a.fail("lookup", err)
	}
	if *asJSON {
		return a.printJSON(taskToJSON(ti))
	}
	printTask(a.stdout, ti)
	return exitOK
}

// oneID parses the flags and exactly one task id.
func (a *app) oneID(fs *flag.FlagSet, args []string, cmd string) (string, int, bool) {
	pos, code, ok := a.parse(fs, args)
	if !ok {
		return "", code, false
	}
	if len(pos) != 1 {
		fmt.Fprintf(a.stderr, "engine %s: want one task id, got %d arguments\n", cmd, len(pos))
		return "", exitUsage, false
	}
	return pos[0], 0, true
}

func (a *app) printJSON(v any) int {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(a.stderr, "engine: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// taskJSON is a task as lookup --json and dead list --json print it.
type taskJSON struct {
	ID            string     `json:"id"`
	State         string     `json:"state"`
	Queue         string     `json:"queue"`
	Type          string     `json:"type"`
	Attempts      int        `json:"attempts"`
	MaxAttempts   int        `json:"max_attempts"`
	Recoveries    int        `json:"recoveries"`
	TimeoutMS     int64      `json:"timeout_ms"`
	Created       time.Time  `json:"created"`
	Due           time.Time  `json:"due"`
	Started       *time.Time `json:"started,omitempty"`
	Finished      *time.Time `json:"finished,omitempty"`
	Worker        string     `json:"worker,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	Payload       *string    `json:"payload,omitempty"`
	PayloadBase64 string     `json:"payload_base64,omitempty"`
}

func taskToJSON(ti *engine.TaskInfo) taskJSON {
	tj := taskJSON{ID: ti.ID, State: string(ti.State), Queue: ti.Queue, Type: ti.Type,
		Attempts: ti.Attempts, MaxAttempts: ti.MaxAttempts, Recoveries: ti.Recoveries,
		TimeoutMS: ti.Timeout.Milliseconds(), Created: ti.Created.UTC(), Due: ti.Due.UTC(),
		Worker: ti.Worker, LastError: ti.LastError}
	if !ti.Started.IsZero() {
		t := ti.Started.UTC()
		tj.Started = &t
	}
	if !ti.Finished.IsZero() {
		t := ti.Finished.UTC()
		tj.Finished = &t
	}
	if utf8.Valid(ti.Payload) {
		p := string(ti.Payload)
		tj.Payload = &p
	} else {
		tj.PayloadBase64 = base64.StdEncoding.EncodeToString(ti.Payload)
	}
	return tj
}

func printTask(w io.Writer, ti *engine.TaskInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	row("id", "%s", ti.ID)
	row("state", "%s", ti.State)
	row("queue", "%s", ti.Queue)
	row("type", "%s", ti.Type)
	row("attempts", "%d failed of %d allowed", ti.Attempts, ti.MaxAttempts)
	if ti.Recoveries > 0 {
		row("recoveries", "%d", ti.Recoveries)
	}
	row("timeout", "%v", ti.Timeout)
	row("created", "%s", stamp(ti.Created))
	row("due", "%s", stamp(ti.Due))
	if !ti.Started.IsZero() {
		row("started", "%s", stamp(ti.Started))
	}
	if !ti.Finished.IsZero() {
		row("finished", "%s", stamp(ti.Finished))
	}
	if ti.Worker != "" {
		row("worker", "%s", ti.Worker)
	}
	if ti.LastError != "" {
		row("last error", "%s", firstLine(ti.LastError))
	}
	row("payload", "%d bytes", len(ti.Payload))
	tw.Flush()
}

// stamp is a local time with how far it is from now.
func stamp(t time.Time) string {
	d := time.Until(t).Round(time.Millisecond)
	rel := fmt.Sprintf("in %v", d)
	if d < 0 {
		rel = fmt.Sprintf("%v ago", -d)
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format("2006-01-02 15:04:05.000 MST"), rel)
}
