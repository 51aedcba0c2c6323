//go:build !linux

package main

import (
	"errors"
	"syscall"
)

// childProcAttr puts a child (redis-server, an idle-scenario child) in its
// own process group, so a terminal's ^C reaches only the harness, which then
// stops it in order.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// processCPU is measured on Linux only: elsewhere the CPU figures are n/a.
func processCPU() (float64, error) {
	return 0, errors.New("process CPU time is read on Linux only")
}
