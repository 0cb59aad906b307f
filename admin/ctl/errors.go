package ctl

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit statuses, so a script can tell its own mistake from the cluster's
// answer and a missing object from a cluster it cannot reach.
const (
	exitFailure     = 1 // anything not below
	exitUsage       = 2 // the command line, or an argument the cluster refused (InvalidArgument)
	exitNotFound    = 3 // NotFound
	exitUnavailable = 4 // no admin node answered: nothing listening, no leader, no TLS handshake
	exitDenied      = 5 // PermissionDenied, Unauthenticated
	exitRefused     = 6 // refused in the cluster's present state: FailedPrecondition, AlreadyExists, Aborted, OutOfRange, ResourceExhausted
	exitTimedOut    = 7 // DeadlineExceeded: gave up waiting (--wait past --timeout)
)

// exitCodesHelp is the table above for prismctl --help.
const exitCodesHelp = `Exit status:
  0  success
  1  any other failure
  2  usage: the command line, or an argument the cluster refused (InvalidArgument)
  3  not found
  4  unavailable: no admin node answered (nothing listening, no leader, TLS)
  5  permission denied (PermissionDenied, Unauthenticated)
  6  refused in the cluster's present state (FailedPrecondition, AlreadyExists, ...)
  7  gave up waiting (DeadlineExceeded)`

// exitCode is the exit status of a command that failed with err.
func exitCode(err error) int {
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return exitFailure
	}
	switch se.GRPCStatus().Code() {
	case codes.InvalidArgument:
		return exitUsage
	case codes.NotFound:
		return exitNotFound
	case codes.Unavailable:
		return exitUnavailable
	case codes.PermissionDenied, codes.Unauthenticated:
		return exitDenied
	case codes.FailedPrecondition, codes.AlreadyExists, codes.Aborted, codes.OutOfRange, codes.ResourceExhausted:
		return exitRefused
	case codes.DeadlineExceeded:
		return exitTimedOut
	}
	return exitFailure
}

// statusError shows a gRPC status as "CODE: message" and keeps both the
// status, for the exit code, and the error it came from, for Unreachable.
type statusError struct {
	st    *status.Status
	cause error
}

func (e *statusError) Error() string              { return fmt.Sprintf("%s: %s", e.st.Code(), e.st.Message()) }
func (e *statusError) Unwrap() error              { return e.cause }
func (e *statusError) GRPCStatus() *status.Status { return e.st }

// describe turns a gRPC status into "CODE: message" for the terminal: the
// status of the first error in the chain that carries one, so the node's own
// message shows rather than the text the client wrapped around it.
func describe(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err
	}
	return &statusError{st: se.GRPCStatus(), cause: err}
}
