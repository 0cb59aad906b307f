package main

import "syscall"

// childAttr makes the kernel kill a child when this process dies, so that an interrupted run (Ctrl-C, a
// timeout) leaves no prism process behind.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
