//go:build !unix

package main

import (
	"os"
	"syscall"
)

// groupAttr: process groups are a Unix notion; here a handler command is
// an ordinary child process.
func groupAttr() *syscall.SysProcAttr { return nil }

// killGroup stops the command itself (processes it started are not
// reached; docs/operations.md says so). Only a kill is possible here.
func killGroup(pid int, _ syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
