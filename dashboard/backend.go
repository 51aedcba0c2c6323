package dashboard

import (
	"context"

	"github.com/bucketq/bucketq/engine"
)

// Backend is what the dashboard reads and changes: *engine.Inspector
// implements it (engine.NewInspector).
type Backend interface {
	Queues(ctx context.Context) ([]engine.QueueInfo, error)
	ListTasks(ctx context.Context, opts engine.ListOptions) (*engine.TaskPage, error)
	Task(ctx context.Context, id string) (*engine.TaskInfo, error)
	Workers(ctx context.Context) ([]engine.WorkerInfo, error)
	Act(ctx context.Context, a engine.Action, ids ...string) (engine.ActionResult, error)
	ActAll(ctx context.Context, a engine.Action, f engine.Filter) (engine.ActionResult, error)
	Periodics(ctx context.Context) ([]engine.PeriodicStatus, error)
	PauseQueue(ctx context.Context, q string) error
	ResumeQueue(ctx context.Context, q string) error
	SetQueueLimits(ctx context.Context, qc engine.QueueConfig) error
	Workflow(ctx context.Context, id string) (*engine.WorkflowInfo, error)
	MemoryPolicy(ctx context.Context) (engine.MemoryPolicy, error)
}

var _ Backend = (*engine.Inspector)(nil)

// action is a change asked for by a form: a verb on a selection of tasks
// (IDs) or on every task of a filter (All).
type action struct {
	Verb   engine.Action
	Filter engine.Filter
	IDs    []string
	All    bool
}

// verbsFor lists the actions that apply to tasks in state s, in the
// order the buttons show them.
func verbsFor(s engine.State) []engine.Action {
	switch s {
	case engine.StateScheduled:
		return []engine.Action{engine.ActionRun, engine.ActionCancel, engine.ActionDelete}
	case engine.StateReady:
		return []engine.Action{engine.ActionCancel, engine.ActionDelete}
	case engine.StateRetrying:
		return []engine.Action{engine.ActionRun, engine.ActionCancel, engine.ActionDelete}
	case engine.StateRunning, engine.StateDone, engine.StateCancelled:
		return []engine.Action{engine.ActionDelete}
	case engine.StateDead:
		return []engine.Action{engine.ActionRetry, engine.ActionDelete}
	}
	return nil
}

// destructive says whether a loses something an operator may want:
// those ask for confirmation first.
func destructive(a engine.Action) bool { return a == engine.ActionCancel || a == engine.ActionDelete }

var verbLabel = map[engine.Action]string{engine.ActionRun: "Run now", engine.ActionRetry: "Retry",
	engine.ActionCancel: "Cancel", engine.ActionDelete: "Delete"}

var verbPast = map[engine.Action]string{engine.ActionRun: "made ready now", engine.ActionRetry: "retried",
	engine.ActionCancel: "cancelled", engine.ActionDelete: "deleted"}
