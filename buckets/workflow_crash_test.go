package buckets

import (
	"context"
	"fmt"

	"github.com/gomodule/redigo/redis"
)

// The workflow transactions join TestCrashPoints: each is run undisturbed,
// crashed before EXEC (nothing written) and after EXEC (all written).
func init() {
	crashCases = append(crashCases, flowCrashCases...)
	crashBefore["FinishHeld/chain step"] = struct {
		skip int
		mid  func(ctx context.Context, s *Store, c redis.Conn) error
	}{1, chainClaimed("c", 3, 0)}
}

// chainClaimed enqueues chain id of n steps and runs it up to step at,
// which it leaves claimed by w1.
func chainClaimed(id string, n, at int) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := enqueueChain(id, n)(ctx, s, c); err != nil {
			return err
		}
		for i := 0; ; i++ {
			r, err := claimNext(ctx, s, c, w1)
			if err != nil {
				return err
			}
			if i == at {
				return nil
			}
			if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+20, 60, finishAs(Done, "r")); err != nil {
				return err
			}
		}
	}
}

// groupClaimed enqueues group id of n members, finishes the first done
// of them (done), and leaves the others claimed by w1.
func groupClaimed(id string, n, done int, policy string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := enqueueGroup(id, n, policy)(ctx, s, c); err != nil {
			return err
		}
		for i := range n {
			r, err := claimNext(ctx, s, c, w1)
			if err != nil {
				return err
			}
			if i < done {
				if _, _, err := s.Finish(ctx, c, w1, r.ID, r.Runs, t0+20, 60, finishAs(Done, fmt.Sprint(i))); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

var flowCrashCases = []crashCase{
	{"EnqueueFlow/chain", nothing, enqueueChain("c", 3)},
	{"EnqueueFlow/group", nothing, enqueueGroup("g", 3, PolicyFail)},
	{"Finish/chain step done", chainClaimed("c", 3, 1), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("c", 1), 1, t0+30, 60, finishAs(Done, "out"))
		return err
	}},
	{"Finish/chain last step done", chainClaimed("c", 2, 1), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("c", 1), 1, t0+30, 60, finishAs(Done, "out"))
		return err
	}},
	{"FinishHeld/chain step", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := enqueueChain("c", 3)(ctx, s, c); err != nil {
			return err
		}
		_, err := s.Pop(ctx, c, "q", w1)
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		var cs ClaimState
		rec, res, err := s.Claim(ctx, c, w1, "q", FlowStepID("c", 0), t0+10, lease, true, &cs)
		if err != nil || res != Claimed {
			return fmt.Errorf("claim: %v, %v", res, err)
		}
		_, _, _, err = s.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 60, finishAs(Done, "out"), nil)
		return err
	}},
	{"Finish/group member, not the last", groupClaimed("g", 3, 0, PolicyFail), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("g", 0), 1, t0+30, 60, finishAs(Done, "out"))
		return err
	}},
	{"Finish/group last member fires", groupClaimed("g", 3, 2, PolicyFail), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("g", 2), 1, t0+30, 60, finishAs(Done, "out"))
		return err
	}},
	{"Finish/group last member dead, fail policy", groupClaimed("g", 2, 1, PolicyFail), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("g", 1), 1, t0+30, 60, finishAs(Bury, ""))
		return err
	}},
	{"Finish/group last member dead, continue policy", groupClaimed("g", 2, 1, PolicyContinue), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, FlowStepID("g", 1), 1, t0+30, 60, finishAs(Bury, ""))
		return err
	}},
	{"Requeue/group members buried", groupClaimed("g", 3, 1, PolicyContinue), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Requeue(ctx, c, w1, []string{FlowStepID("g", 1), FlowStepID("g", 2)}, t0+40, WorkerDied, 0)
		return err
	}},
	{"Cancel/group member", func(ctx context.Context, s *Store, c redis.Conn) error {
		return enqueueGroup("g", 2, PolicyContinue)(ctx, s, c)
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Cancel(ctx, c, FlowStepID("g", 1), t0+10, 3600)
	}},
	{"stopStep/chain step running", chainClaimed("c", 3, 0), func(ctx context.Context, s *Store, c redis.Conn) error {
		done, _, err := s.stopStep(ctx, c, FlowStepID("c", 0), t0+20, 3600)
		if err == nil && !done {
			err = fmt.Errorf("not done")
		}
		return err
	}},
}
