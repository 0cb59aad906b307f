//go:build !linux

package main

import "syscall"

// childAttr: only Linux kills children with their parent; elsewhere an interrupted run leaves them running.
func childAttr() *syscall.SysProcAttr { return nil }
