//go:build !linux

package chaos

import "os/exec"

// setProcAttr does nothing here: only Linux has a parent-death signal.
func setProcAttr(cmd *exec.Cmd) {}
