// Package schedule computes the firings of periodic entries: when a cron
// expression or a fixed interval fires, what a process that finds firings
// missed while no process was running should do with them, and the task id
// each firing is enqueued under.
//
// It is pure computation: no Redis, no clock of its own. Every function
// takes the times it needs, so any number of processes that know the same
// entry compute the same firings and the same ids without talking to each
// other, and tests run on fixed times.
//
// # Schedules
//
// A [Spec] is either a cron expression (github.com/robfig/cron/v3 syntax:
// 5 fields, or 6 with a leading seconds field; descriptors such as @hourly,
// @daily, @every 90s) read in an IANA time zone (UTC when none is given,
// never the host's local zone, which processes would not agree on), or a
// fixed interval.
//
// A fixed interval (Spec.Every, or "@every" in a cron expression) fires at
// the multiples of the interval since the Unix epoch (1970-01-01T00:00:00Z):
// every process computes the same firings from the interval alone, nothing
// has to be stored or agreed on first, and a restart or a new process
// continues on the same grid. An anchor stored with the entry would need a
// first writer to win and every process to read it before scheduling, and
// changing it would move every firing. The price: intervals that do not
// divide a day do not line up with wall-clock hours; use a cron expression
// for that. Intervals are whole seconds, at least one.
//
// # Daylight-saving time
//
// Cron expressions name wall-clock times, which a daylight-saving change
// skips (spring forward) or repeats (fall back). The rule is the one the
// classic cron daemons (Vixie/ISC cron) apply to fixed-time jobs, with the
// line between fixed-time and interval-like drawn at the hour field:
//
//   - A time-of-day schedule (the hour field does not name every hour, as in
//     "30 2 * * *" or @daily) fires once per matching wall-clock time: a
//     time inside a gap fires at the end of the gap (02:30 on the day Berlin
//     jumps from 02:00 to 03:00 fires at 03:00 CEST), and a repeated time
//     fires only at its first occurrence (02:30 CEST, not again at 02:30
//     CET). A daily job runs once on both change days.
//   - An interval-like schedule (the hour field names every hour, as in
//     "0 * * * *" or "*/15 * * * *") follows real time: wall-clock times in
//     a gap do not exist and do not fire, and a repeated hour fires twice,
//     so "*/15" keeps firing every 15 real minutes through both changes.
//
// # Passes, missed firings and ids
//
// A process keeps an entry's next firings enqueued ahead of time, one
// scheduling pass after another. [Schedule.Plan] decides a pass from the
// entry's stored watermark ("last scheduled") and the process's clock:
// which firings whose time passed unscheduled to run under the [Missed]
// policy, which upcoming ones to enqueue, and the new watermark to store in
// the same transaction. [FiringID] names each firing's task, so that
// processes enqueueing the same firing write one task.
//
// # Time zone data
//
// Zones are loaded with time.LoadLocation, which needs a time zone database
// on the host (or time/tzdata linked into the program). This package does
// not import time/tzdata: it would add about 450 kB to every program that
// links the engine, and the Go documentation leaves that choice to the main
// package. A daemon meant for minimal containers should import it in main.
// A missing zone is a clear error from [Parse], never a silent fall-back to
// UTC. The tests import time/tzdata so that they run anywhere.
package schedule
