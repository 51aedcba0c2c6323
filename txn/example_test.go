package txn_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// A ZPOP built from WATCH, ZRANGE and a MULTI that removes what it read: if
// another client changes the set in between, EXEC answers nil and Run reads
// again.
func Example_zpop() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	conn, _ := redis.Dial("tcp", mr.Addr())
	defer conn.Close()
	conn.Do("ZADD", "z", 1, "a", 2, "b")

	var popped string
	_, err := txn.Run(context.Background(), conn, []string{"z"}, func(tx *txn.Tx) error {
		members, err := redis.Strings(tx.Do("ZRANGE", "z", 0, 0))
		if err != nil || len(members) == 0 {
			return err
		}
		popped = members[0]
		tx.Queue("ZREM", "z", popped)
		return nil
	})
	left, _ := redis.Int(conn.Do("ZCARD", "z"))
	fmt.Println(popped, left, err)
	// Output: a 1 <nil>
}

// Moving several lists into one, one transaction per list, with each
// transaction's EXEC sent together with the next one's WATCH and read: three
// transactions in four round trips.
func ExampleRunner_Pipeline() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	conn, _ := redis.Dial("tcp", mr.Addr())
	defer conn.Close()
	conn.Do("RPUSH", "in:1", "a", "b")
	conn.Do("RPUSH", "in:2", "c")
	conn.Do("RPUSH", "in:3", "d")

	var r txn.Runner
	var steps []txn.Step
	for _, key := range []string{"in:1", "in:2", "in:3"} {
		steps = append(steps, txn.Step{
			Watch: []string{key},
			Reads: []txn.Cmd{{Name: "LRANGE", Args: []interface{}{key, 0, -1}}},
			Build: func(reads []interface{}, q *txn.Cmds) error {
				items, err := redis.Strings(reads[0], nil)
				if err != nil || len(items) == 0 {
					return err
				}
				q.Queue("RPUSH", append([]interface{}{"out"}, redis.Args{}.AddFlat(items)...)...)
				q.Queue("DEL", key)
				return nil
			},
		})
	}
	results, err := r.Pipeline(context.Background(), conn, steps)
	for i, res := range results {
		fmt.Println("step", i, res.Err)
	}
	out, _ := redis.Strings(conn.Do("LRANGE", "out", 0, -1))
	fmt.Println(out, err)
	// Output:
	// step 0 <nil>
	// step 1 <nil>
	// step 2 <nil>
	// [a b c d] <nil>
}

// A lease: the first transaction claims a job and holds a watch on it; the
// second records the result without reading the job again, and sends the
// next command behind its EXEC in the same round trip. Had anyone touched
// the job in between, Exec would report ErrConflict and write nothing.
func ExampleTx_Hold() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	conn, _ := redis.Dial("tcp", mr.Addr())
	defer conn.Close()
	conn.Do("SET", "job:7", "waiting")
	ctx := context.Background()

	var held *txn.Held
	_, err := txn.Run(ctx, conn, []string{"job:7"}, func(tx *txn.Tx) error {
		held = nil
		state, err := redis.String(tx.Do("GET", "job:7"))
		if err != nil || state != "waiting" {
			return err
		}
		tx.Queue("SET", "job:7", "running")
		held = tx.Hold("job:7")
		return nil
	})
	if err != nil || held == nil {
		fmt.Println("not claimed:", err)
		return
	}

	// ... the job runs; nothing else uses conn meanwhile ...

	_, after, err := held.Exec(ctx, []txn.Cmd{{Name: "SET", Args: []interface{}{"job:7", "done"}}},
		txn.Cmd{Name: "GET", Args: []interface{}{"job:7"}})
	if errors.Is(err, txn.ErrConflict) {
		fmt.Println("the job changed while it ran")
		return
	}
	state, _ := redis.String(after[0], nil)
	fmt.Println(state, err)
	// Output: done <nil>
}
