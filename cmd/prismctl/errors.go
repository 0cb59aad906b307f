package main

import (
	"fmt"

	"google.golang.org/grpc/status"
)

// describe turns a gRPC status into "CODE: message" for the terminal.
func describe(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return fmt.Errorf("%s: %s", st.Code(), st.Message())
}
