package main

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestDescribe(t *testing.T) {
	t.Parallel()
	notFound := status.Error(codes.NotFound, `namespace "x" not found`)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"a status", notFound, `NotFound: namespace "x" not found`},
		{"a status the client wrapped in context", fmt.Errorf("GetNamespace on 127.0.0.1:1: %w", notFound), `NotFound: namespace "x" not found`},
		{"no status", errors.New("--format: bad"), "--format: bad"},
	}
	for _, tc := range cases {
		if got := describe(tc.err).Error(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
