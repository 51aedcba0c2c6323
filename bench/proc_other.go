//go:build !linux

package main

import "syscall"

// childProcAttr puts a child (redis-server, an idle-scenario child) in its
// own process group, so a terminal's ^C reaches only the harness, which then
// stops it in order.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
