package chaos

import (
	"context"
	"fmt"

	"github.com/bucketq/bucketq/engine"
)

// checkNamespace runs the engine's consistency check on the namespace once
// every process has stopped, and returns a failure per finding: after any
// scenario, every gauge must match the structures and every task must be
// where its state says.
func (h *harness) checkNamespace(ctx context.Context) []string {
	c, err := engine.NewClient(h.admin, engine.Config{Namespace: h.ns, MaxPayload: MaxPayload})
	if err != nil {
		return []string{fmt.Sprintf("namespace check: %v", err)}
	}
	rep, err := c.Check(ctx, engine.CheckOptions{})
	if err != nil {
		return []string{fmt.Sprintf("namespace check: %v", err)}
	}
	var out []string
	for _, f := range rep.Findings {
		out = append(out, "namespace check: "+f.Message)
	}
	// Nothing runs any more: a finding that cannot be confirmed is not
	// a task in motion.
	for _, f := range rep.Unconfirmed {
		out = append(out, "namespace check (unconfirmed, nothing should be moving): "+f.Message)
	}
	h.logf("namespace check: %d tasks in %d queues, %d findings", rep.Tasks, rep.Queues, len(out))
	return out
}
