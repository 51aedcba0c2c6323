package main

import "syscall"

// childProcAttr puts a child (redis-server, an idle-scenario child) in its
// own process group, so a terminal's ^C reaches only the harness, which then
// stops it in order, and has the kernel kill it if the harness dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
