// Package tracestack reads the stacks of an execution trace (golang.org/x/exp/trace), for the benchmarks that
// say where a run's goroutines waited.
package tracestack

import "golang.org/x/exp/trace"

// Funcs is the stack's function names, innermost first; nil for a stack the trace did not record.
func Funcs(s trace.Stack) []string {
	if s == trace.NoStack {
		return nil
	}
	var out []string
	for f := range s.Frames() {
		out = append(out, f.Func)
	}
	return out
}
