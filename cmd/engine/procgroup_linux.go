package main

import "syscall"

// groupAttr starts a handler command as the leader of its own process
// group, so that the group can be signalled as one. Pdeathsig kills the
// leader when engine dies, even by SIGKILL or the OOM killer: a handler
// must not run on unsupervised beside the recovered copy of its task.
// Processes the leader started itself are not covered: they are killed
// only while engine lives (docs/operations.md says so).
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
