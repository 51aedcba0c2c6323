//go:build linux

package chaos

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes a child die with SIGKILL if the harness dies first,
// so that an interrupted run leaves no engine processes or servers behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
