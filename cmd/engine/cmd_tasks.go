package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/spf13/cobra"
)

func (a *app) newEnqueueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "enqueue --type TYPE [flags]",
		Short: "add a task; prints its id",
		Long: `Adds a task and prints its id. The payload is --payload TEXT or the
file --payload-file PATH; "-" for either reads stdin, which is read only
when asked for. Without --in or --at the task is due now.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd)
	f := cmd.Flags()
	queue := f.String("queue", "", "queue `name` (default: default_queue)")
	typ := f.String("type", "", "task `type` (required): names the handler")
	payload := f.String("payload", "", "payload `text`, or - for stdin")
	payloadFile := f.String("payload-file", "", "read the payload from this `file`, or - for stdin")
	taskID := f.String("id", "", "choose the task's `id` (1-128 printable bytes): a retry with the same id never enqueues twice")
	in := f.Duration("in", 0, "due this long from now, e.g. 30s")
	at := f.String("at", "", "due at this RFC 3339 `time`, e.g. 2030-01-02T15:04:05Z")
	maxAttempts := f.Int("max-attempts", 0, "failed runs before the dead letters (default: default_max_attempts)")
	timeout := f.Duration("timeout", 0, "bound on one run (default: default_timeout)")
	expireIn := f.Duration("expire-in", 0, "not worth starting this long from now: if it has not started by then, it goes to the dead letters as expired, e.g. 10m")
	unique := f.Duration("unique", 0, "refuse a duplicate (same queue, type and payload) while one can still run; the key lasts at most this long (0 with --unique-key: until the task ends)")
	uniqueKey := f.String("unique-key", "", "refuse a duplicate with this unique `key` while one can still run")
	priority := f.Int("priority", 1, "the task's `level` in its queue: 1 (runs first) to 4")
	key := f.String("key", "", "the task's flow-control `key` in its queue (a tenant, say): keys are taken round-robin, and the queue's key_max_running and key_rate limit each")
	wait := f.Bool("wait", false, "wait until the task is done, dead or cancelled and print its result")
	waitTimeout := f.Duration("wait-timeout", 0, "with --wait: give up after this long (default: no limit)")
	cmd.MarkFlagsMutuallyExclusive("in", "at")
	cmd.MarkFlagsMutuallyExclusive("payload", "payload-file")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		given := func(name string) bool { return f.Changed(name) }
		var opts []engine.Option
		switch {
		case *typ == "":
			return a.usageError(cmd, "--type is required")
		case checkTaskType(*typ) != nil:
			return a.usageError(cmd, "--type: %v", checkTaskType(*typ))
		case *in < 0:
			return a.usageError(cmd, "--in %v: want 0 or more", *in)
		case *queue != "":
			opts = append(opts, engine.Queue(*queue))
		}
		if given("max-attempts") {
			opts = append(opts, engine.MaxAttempts(*maxAttempts))
		}
		if given("priority") {
			if err := checkPriority(*priority, false); err != nil {
				return a.usageError(cmd, "--priority %d: %v", *priority, err)
			}
			opts = append(opts, engine.Priority(*priority))
		}
		if given("id") {
			opts = append(opts, engine.TaskID(*taskID))
		}
		if given("key") {
			opts = append(opts, engine.Key(*key))
		}
		if given("timeout") {
			opts = append(opts, engine.Timeout(*timeout))
		}
		if given("expire-in") {
			opts = append(opts, engine.ExpireIn(*expireIn))
		}
		switch {
		case given("unique-key"):
			opts = append(opts, engine.UniqueKey(*uniqueKey, *unique))
		case given("unique"):
			if *unique <= 0 {
				return a.usageError(cmd, "--unique %v: want a positive lifetime, e.g. 10m", *unique)
			}
			opts = append(opts, engine.Unique(*unique))
		}
		if given("wait-timeout") && (!*wait || *waitTimeout <= 0) {
			return a.usageError(cmd, "--wait-timeout %v: want a positive duration, with --wait", *waitTimeout)
		}
		switch {
		case given("in"):
			opts = append(opts, engine.In(*in))
		case given("at"):
			t, err := time.Parse(time.RFC3339Nano, *at)
			if err != nil {
				return a.usageError(cmd, "--at %s: want RFC 3339, e.g. 2030-01-02T15:04:05Z", safetext.Quote(*at))
			}
			opts = append(opts, engine.At(t))
		}
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		body := []byte(*payload)
		if *payload == "-" || *payloadFile != "" {
			if body, err = a.readPayload(*payloadFile, s.set.Engine.MaxPayload); err != nil {
				return a.fail("enqueue", err)
			}
		}
		info, err := s.client.Enqueue(cmd.Context(), *typ, body, opts...)
		var dup *engine.ExistsError
		if errors.As(err, &dup) && dup.Key != "" { // a held unique key: its holder
			fmt.Fprintln(a.stdout, dup.IDs[0])
		}
		if err != nil {
			return a.fail("enqueue", err)
		}
		if !*wait {
			fmt.Fprintln(a.stdout, info.ID)
			return nil
		}
		fmt.Fprintln(a.stderr, info.ID)
		a.hintUnserved(cmd.Context(), s, info.Queue)
		return a.waitFor(cmd, s.client, info.ID, *waitTimeout)
	}
	return cmd
}

// checkPriority checks a --priority level: 1 to 4, or 0 (every level)
// when every is true.
func checkPriority(n int, every bool) error {
	if n == 0 && every {
		return nil
	}
	if n < 1 || n > 4 {
		if every {
			return errors.New("want 1 to 4, or 0 for every level")
		}
		return errors.New("want 1 (runs first) to 4")
	}
	return nil
}

// hintUnserved says on stderr when no live worker serves queue q, so
// that a wait for a task in a mistyped queue does not look like a slow
// worker.
func (a *app) hintUnserved(ctx context.Context, s *session, q string) {
	served, err := servedQueues(ctx, s.in)
	if err != nil || slices.Contains(served, q) {
		return
	}
	which := "there is no live worker"
	if len(served) > 0 {
		which = "live workers serve " + strings.Join(served, ", ")
	}
	fmt.Fprintf(a.stderr, "engine enqueue: no live worker serves queue %q (%s): the task waits until one does\n", q, which)
}

// waitFor waits for task id to end and prints its result on stdout (the
// error of a dead task on stderr). The exit code tells the outcome: 0
// done, 8 dead, 9 cancelled, 10 timeout.
func (a *app) waitFor(cmd *cobra.Command, client *engine.Client, id string, timeout time.Duration) error {
	ctx := cmd.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	o, err := client.Wait(ctx, id)
	switch {
	case errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil:
		fmt.Fprintf(a.stderr, "engine enqueue: task %s did not end within %v; it is still queued or running\n", id, timeout)
		return exitCode(exitWaitTimeout)
	case err != nil:
		return a.fail("enqueue --wait", err)
	}
	switch o.State {
	case engine.StateDone:
		_, _ = a.stdout.Write(o.Result)
		return nil
	case engine.StateDead:
		fmt.Fprintf(a.stderr, "engine enqueue: task %s died: %s\n", id, o.Error)
		return exitCode(exitWaitDead)
	}
	fmt.Fprintf(a.stderr, "engine enqueue: task %s was %s\n", id, o.State)
	return exitCode(exitWaitCanceled)
}

// readPayload reads the payload from path ("" or "-": stdin), at most
// limit+1 bytes (limit 0: the default max_payload): enough to refuse an
// oversized one without holding all of it. The refusal (matching
// engine.ErrTooLarge) gives a file's real size.
func (a *app) readPayload(path string, limit int) ([]byte, error) {
	if limit == 0 {
		limit = engine.DefaultConfig().MaxPayload
	}
	b, name, size, err := a.readInput(path, limit)
	if err != nil {
		return nil, fmt.Errorf("read payload: %w", err)
	}
	if len(b) > limit {
		if size > int64(limit) {
			return nil, fmt.Errorf("payload file %s is %d bytes, more than max_payload (%d bytes): %w", name, size, limit, engine.ErrTooLarge)
		}
		return nil, fmt.Errorf("payload from %s is more than %d bytes (max_payload): %w", name, limit, engine.ErrTooLarge)
	}
	return b, nil
}

// readInput reads path ("" or "-": stdin) up to limit+1 bytes: enough to
// tell an input over the limit without holding all of it. It returns
// what it read, the input's name, and its size when a regular file knows
// it (-1 otherwise), so that a refusal can say the real size.
func (a *app) readInput(path string, limit int) (b []byte, name string, size int64, err error) {
	r, name, size := a.stdin, "stdin", int64(-1)
	if path != "" && path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, path, -1, err
		}
		defer f.Close()
		r, name = f, path
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			size = fi.Size()
		}
	}
	if r == nil {
		r = strings.NewReader("")
	}
	b, err = io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, name, size, fmt.Errorf("from %s: %w", name, err)
	}
	return b, name, size, nil
}

func (a *app) newCancelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "cancel a task that has not started",
		Long: `Cancels a task that has not started: it will not run. Exits 3 if there is
no such task, 4 if it is running or finished already.`,
		Args: oneID,
	}
	c := addCommon(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		if err := s.client.Cancel(cmd.Context(), args[0]); err != nil {
			return a.fail("cancel", err)
		}
		fmt.Fprintf(a.stdout, "cancelled %s\n", args[0])
		return nil
	}
	return cmd
}

func (a *app) newLookupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lookup ID [--json]",
		Short: "show a task's state and times",
		Long: `Shows a task's state (scheduled, ready, running, retrying, done, dead,
cancelled), attempts and times. Done and cancelled tasks are kept for
done_retention, dead ones for dead_retention. Exits 3 if not found.`,
		Args: oneID,
	}
	c := addCommon(cmd)
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := a.connect(cmd, c)
		if err != nil {
			return err
		}
		defer s.close()
		tv, err := s.in.Task(cmd.Context(), args[0]) // with a done task's result
		if err != nil {
			return a.fail("lookup", err)
		}
		if *asJSON {
			j := taskToJSON(tv)
			j.Result = tv.Result
			return a.printJSON(j)
		}
		printTask(safetext.Writer(a.stdout), tv)
		if tv.Result != nil {
			printResult(safetext.Writer(a.stdout), tv.Result)
		}
		return nil
	}
	return cmd
}

// oneID accepts exactly one argument, a task id.
func oneID(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one task id, got %d arguments", len(args))
	}
	return nil
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(safetext.Writer(a.stdout))
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return a.fail("", err)
	}
	return nil
}

// taskJSON is a task as lookup --json and dead list --json print it.
type taskJSON struct {
	ID            string        `json:"id"`
	State         string        `json:"state"`
	Queue         string        `json:"queue"`
	Priority      int           `json:"priority"`
	Key           string        `json:"key,omitempty"`
	Type          string        `json:"type"`
	Attempts      int           `json:"attempts"`
	MaxAttempts   int           `json:"max_attempts"`
	Recoveries    int           `json:"recoveries"`
	Snoozes       int           `json:"snoozes"`
	Expires       *time.Time    `json:"expires,omitempty"`
	TimeoutMS     int64         `json:"timeout_ms"`
	Created       time.Time     `json:"created"`
	Due           time.Time     `json:"due"`
	Started       *time.Time    `json:"started,omitempty"`
	Finished      *time.Time    `json:"finished,omitempty"`
	Result        []byte        `json:"result,omitempty"` // lookup: a done task's result (base64)
	Worker        string        `json:"worker,omitempty"`
	LastError     string        `json:"last_error,omitempty"`
	Progress      *progressJSON `json:"progress,omitempty"`
	Payload       *string       `json:"payload,omitempty"`
	PayloadBase64 string        `json:"payload_base64,omitempty"`
}

// progressJSON is what a task's handler last reported (SetProgress).
type progressJSON struct {
	Value float64   `json:"value"`
	Note  string    `json:"note,omitempty"`
	At    time.Time `json:"at"`
}

func taskToJSON(ti *engine.TaskInfo) taskJSON {
	tj := taskJSON{ID: ti.ID, State: string(ti.State), Queue: ti.Queue, Priority: ti.Priority, Key: ti.Key, Type: ti.Type,
		Attempts: ti.Attempts, MaxAttempts: ti.MaxAttempts, Recoveries: ti.Recoveries, Snoozes: ti.Snoozes,
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
	if !ti.Expires.IsZero() {
		t := ti.Expires.UTC()
		tj.Expires = &t
	}
	if !ti.ProgressTime.IsZero() {
		tj.Progress = &progressJSON{Value: ti.Progress, Note: ti.ProgressNote, At: ti.ProgressTime.UTC()}
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
	row("priority", "%d", ti.Priority)
	if ti.Key != "" {
		row("key", "%s", ti.Key)
	}
	row("type", "%s", ti.Type)
	row("attempts", "%d failed of %d allowed", ti.Attempts, ti.MaxAttempts)
	if ti.Recoveries > 0 {
		row("recoveries", "%d", ti.Recoveries)
	}
	if ti.Snoozes > 0 {
		row("snoozes", "%d", ti.Snoozes)
	}
	row("timeout", "%v", ti.Timeout)
	row("created", "%s", stamp(ti.Created))
	row("due", "%s", stamp(ti.Due))
	if !ti.Expires.IsZero() {
		row("expires", "%s", stamp(ti.Expires))
	}
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
	if !ti.ProgressTime.IsZero() {
		row("progress", "%g %s (%s)", ti.Progress, firstLine(ti.ProgressNote), stamp(ti.ProgressTime))
	}
	row("payload", "%d bytes", len(ti.Payload))
	if wf := ti.Workflow; wf != nil {
		row("workflow", "%s %s, task %d of %d (engine workflow show %s)", wf.Kind, wf.ID, wf.Index+1, wf.Total, wf.ID)
	}
	tw.Flush()
}

// stamp is a local time with how far it is from now.
func stamp(t time.Time) string {
	return fmt.Sprintf("%s (%s)", t.Local().Format("2006-01-02 15:04:05.000 MST"), relative(t, time.Now()))
}

// relative says how far t is from now: "in 1.5s", "3 days ago", "in 974
// years" (a Duration holds only 292 years).
func relative(t, now time.Time) string {
	d := t.Sub(now)
	var s string
	switch a := d.Abs(); {
	case a >= 2*365*24*time.Hour:
		s = fmt.Sprintf("%d years", max(t.Year()-now.Year(), now.Year()-t.Year()))
	case a >= 48*time.Hour:
		s = fmt.Sprintf("%d days", a/(24*time.Hour))
	default:
		s = a.Round(time.Millisecond).String()
	}
	if d < 0 {
		return s + " ago"
	}
	return "in " + s
}

// printResult shows a done task's result after lookup's table: the text
// when it is printable UTF-8, else its size and base64.
func printResult(w io.Writer, b []byte) {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < ' ' && r != '\n' && r != '\t' }) {
		fmt.Fprintf(w, "result (%d bytes):\n%s", len(b), b)
		if !strings.HasSuffix(string(b), "\n") {
			fmt.Fprintln(w)
		}
		return
	}
	fmt.Fprintf(w, "result (%d bytes, base64):\n%s\n", len(b), base64.StdEncoding.EncodeToString(b))
}
