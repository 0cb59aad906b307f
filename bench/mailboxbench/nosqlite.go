//go:build !libsqlite3

package main

// benchSQLite needs cgo and Debian's libsqlite3; bench/mailbox.sh builds with -tags libsqlite3.
func benchSQLite(config, string, map[string][]query) error {
	note("sqlite baseline skipped: built without -tags libsqlite3")
	return nil
}
