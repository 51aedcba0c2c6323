package compat_test

import (
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/redis24"
)

// scenario is one end-to-end behaviour of the engine, run on every server.
type scenario struct {
	name string
	run  func(e *env)
	// realOnly: not on miniredis, whose keys expire only when the test
	// moves its clock, so its TTLs run ahead of the processes' clocks in a
	// way no server's do.
	realOnly bool
}

// scenarios is the conformance list. Every scenario uses its own namespace
// and runs in parallel with the others.
var scenarios = []scenario{
	{name: "enqueue", run: scenarioEnqueue},
	{name: "schedule", run: scenarioSchedule},
	{name: "cancel", run: scenarioCancel},
	{name: "cancel-race", run: scenarioCancelRace},
	{name: "periodic", run: scenarioPeriodic},
	{name: "exactly-once", run: scenarioExactlyOnce},
	{name: "retries", run: scenarioRetries},
	{name: "dead-letters", run: scenarioDeadLetters},
	{name: "lease-expiry", run: scenarioLeaseExpiry},
	{name: "recovery", run: scenarioRecovery},
	{name: "recovery-inflight", run: scenarioRecoveryInflight},
	{name: "priorities", run: scenarioPriorities},
	{name: "shutdown", run: scenarioShutdown},
	{name: "idle-wake", run: scenarioIdleWake},
	{name: "lost-move-reply", run: func(e *env) { scenarioLostMoveReply(e) }},
	{name: "lost-move-reply/list", run: func(e *env) { scenarioLostMoveReply(e, engine.TaskID("lost-move-reply")) }},
	{name: "dispatch-turn", run: scenarioDispatchTurn},
	{name: "wrong-type", run: scenarioWrongType},
	{name: "unique-results", run: scenarioUniqueResults},
	{name: "pause", run: scenarioPause},
	{name: "queue-limit", run: scenarioQueueLimit},
	{name: "keys", run: scenarioKeys},
	{name: "handler-sets", run: scenarioHandlerSets},
	{name: "watch-expiry/redis7", run: func(e *env) { scenarioWatchExpiry(e, false) }},
	{name: "watch-expiry/sim24", run: func(e *env) { scenarioWatchExpiry(e, true) }},
	{name: "forget-race/redis7", run: func(e *env) { scenarioForgetRace(e, popInWindow7) }, realOnly: true},
	{name: "forget-race/sim24", run: func(e *env) { scenarioForgetRace(e, popInWindow24) }, realOnly: true},
	{name: "forget-race/after-forget", run: func(e *env) { scenarioForgetRace(e, popAfterForget) }, realOnly: true},
}

// kinds returns the servers to run on: miniredis with the 2.4 hook and a
// redis-server restricted by ACL to the 2.4 table, or, when
// ENGINE_TEST_REDIS is set, only that server (nothing is started).
func kinds() []*kind {
	if os.Getenv(redistest.EnvAddr) != "" {
		return []*kind{{name: "external"}}
	}
	return []*kind{{name: "miniredis"}, {name: "redis"}, {name: "redis24"}}
}

// TestConformance runs every scenario on every server, then checks the
// command census of each server: nothing outside the Redis 2.4 table, no
// violation of its argument forms, and exactly the commands that
// docs/compat.md lists.
func TestConformance(t *testing.T) {
	for _, k := range kinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			k.census = redis24.NewCensus()
			k.args = newArgCensus()
			k.ran = map[string]bool{}
			k.side = side7 // miniredis aborts EXEC as Redis 7 does
			if k.name != "miniredis" {
				k.shared = startKind(t, k.name)
				k.census = k.shared.Census
				var err error
				if k.side, k.version, err = serverSide(k.shared.Admin(t)); err != nil {
					t.Fatalf("server %s: %v", k.shared.Addr, err)
				}
			}
			runScenarios(t, k)
		})
	}
}

// startKind starts the server of a kind: a real Redis 2.4 for "redis24"
// (skipped, saying so, without REDIS24_SERVER), else redistest.Start's.
func startKind(t *testing.T, name string) *redistest.Server {
	if name == "redis24" {
		return redistest.Start24(t)
	}
	return redistest.Start(t)
}

// runScenarios runs the scenarios on k in parallel, and checks k's census
// once they all ended.
func runScenarios(t *testing.T, k *kind) {
	// Runs after every scenario (parallel subtests included) ended.
	t.Cleanup(func() { checkCensus(t, k) })
	for _, sc := range scenarios {
		if sc.realOnly && k.name == "miniredis" {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			k.mu.Lock()
			k.ran[sc.name] = true
			k.mu.Unlock()
			sc.run(newEnv(t, k))
		})
	}
}

// checkCensus is the census check of one server kind.
func checkCensus(t *testing.T, k *kind) {
	cmds := k.census.Commands()
	var b strings.Builder
	for _, c := range cmds {
		b.WriteString("\n  " + c + " " + strconv.Itoa(k.census.Count(c)))
	}
	t.Logf("command census on %s (%d distinct commands, with counts):%s", k.name, len(cmds), b.String())
	t.Logf("census list: %s", strings.Join(cmds, " "))

	if out := k.census.Outside24(); len(out) > 0 {
		t.Errorf("the engine sent commands outside the Redis 2.4 table: %v", out)
	}
	for _, v := range k.census.Violations() {
		t.Errorf("Redis 2.4 violation: %v (caller %s)", v, v.Caller)
	}
	k.mu.Lock()
	for _, v := range k.childV {
		t.Errorf("Redis 2.4 violation in a child worker process: %s", v)
	}
	full := len(k.ran) == len(scenarios)
	k.mu.Unlock()

	// The doc must list every command sent; and when the whole list ran, the
	// suite must have seen every command the doc says the engine sends.
	doc, err := readCompatDoc()
	if err != nil {
		t.Errorf("%v", err)
	} else {
		for _, c := range cmds {
			if !doc.lists(c) {
				t.Errorf("the engine sent %s, which docs/compat.md does not list: add it with the reason", strings.ToUpper(c))
			}
		}
		if full {
			for _, c := range doc.sends {
				if !slices.Contains(cmds, c) {
					t.Errorf("docs/compat.md lists %s among the commands the engine sends, but no scenario saw it: "+
						"exercise it, or move it to the error-path table if only failures send it", strings.ToUpper(c))
				}
			}
		} else {
			t.Logf("not every scenario ran: the doc was checked one way only (census within the doc)")
		}
	}

	if err == nil {
		checkSenders(t, &k.args.senders, doc, full)
	}

	// Argument forms behind the 2.4 differences (docs/compat.md).
	a := k.args
	a.mu.Lock()
	defer a.mu.Unlock()
	var timeouts []string
	for v := range a.blockTimeouts {
		timeouts = append(timeouts, v)
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			t.Errorf("blocking timeout %q sent: Redis 2.4 takes whole seconds (and 0 blocks forever)", v)
		}
	}
	sort.Strings(timeouts)
	t.Logf("blocking timeouts sent (seconds): %v; keys blocked on: %v; keys watched: %v; RENAME destinations: %v",
		timeouts, setList(a.blockingKinds), setList(a.watchedKinds), setList(a.renameDests))
	if full && len(timeouts) == 0 {
		t.Errorf("no blocking pop was seen: the idle waits were not exercised")
	}
	for kind := range a.blockingKinds {
		if a.watchedKinds[kind] {
			t.Errorf("keys of kind %q are both WATCHed and blocked on: at 2.4 a push handed to a blocked client does not invalidate WATCH", kind)
		}
		if a.renameDests[kind] {
			t.Errorf("RENAME writes keys of kind %q, which clients block on: at 2.4 RENAME does not wake them", kind)
		}
	}
	for _, c := range a.blockInMulti {
		t.Errorf("blocking command queued inside MULTI (never blocks there): %s", c)
	}
	for v := range a.ttlArgs {
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			t.Errorf("TTL argument %q sent: whole seconds of at least 1 (EXPIRE 0 deletes at 2.4)", v)
		}
	}
	for _, c := range []string{"ttl", "persist", "keys"} {
		if n := k.census.Count(c); n > 0 {
			t.Errorf("the engine sent %s %d times; docs/compat.md says it never does", strings.ToUpper(c), n)
		}
	}

	// The server matrix of the doc must name the server this ran on.
	if k.shared != nil && err == nil {
		t.Logf("server %s: Redis %s (asserted as %s)", k.name, k.version, k.side)
		if k.name == "redis" && !strings.Contains(doc.text, "Redis "+k.version) {
			t.Errorf("docs/compat.md's matrix does not name Redis %s, which the suite started", k.version)
		}
	}
}

func setList(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
