package main

import (
	"fmt"
	"os"
	"syscall"
)

func allocated(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("stat %s: no block count", path)
	}
	return st.Blocks * 512, nil
}
