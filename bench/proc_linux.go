package main

import "syscall"

// childProcAttr puts a child (redis-server, an idle-scenario child) in its
// own process group, so a terminal's ^C reaches only the harness, which then
// stops it in order, and has the kernel kill it if the harness dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// processCPU returns the CPU time (user + system) this process has used so
// far, in seconds.
func processCPU() (float64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, nil
}
