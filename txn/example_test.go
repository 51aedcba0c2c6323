package txn_test

import (
	"context"
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
