package main

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/status"
)

// describe turns a gRPC status into "CODE: message" for the terminal: the
// status of the first error in the chain that carries one, so the node's own
// message shows rather than the text the client wrapped around it.
func describe(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err
	}
	st := se.GRPCStatus()
	return fmt.Errorf("%s: %s", st.Code(), st.Message())
}
