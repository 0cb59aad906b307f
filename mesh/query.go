package mesh

// Bounds of one mailbox query. The store enforces them; the front ends (a
// runner's HTTP API, the gateway) check a request against them before it
// travels, so both name the same numbers in their errors.
const (
	// DefaultQueryLimit is the page size of a query that sets no limit.
	DefaultQueryLimit = 100
	// MaxQueryLimit caps a query's limit; a larger one is clamped.
	MaxQueryLimit = 1000
	// MaxFilterValues bounds the values of one repeated filter field
	// (topics, principals): each value is one index range merged into the
	// result, so the bound keeps one query from opening thousands of
	// iterators.
	MaxFilterValues = 100
)
