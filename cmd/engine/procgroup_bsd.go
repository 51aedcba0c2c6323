//go:build unix && !linux

package main

import "syscall"

// groupAttr starts a handler command as the leader of its own process
// group, so that the group can be signalled as one. These systems have no
// parent-death signal: if engine is killed with SIGKILL, its running
// handlers live on (docs/operations.md says so).
func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
