package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"
)

// ErrDamaged is wrapped by Open's error when a file of the store cannot be
// read as what it claims to be (a truncated or overwritten table). The
// store is left as it is: the way out is to move it aside and re-ingest
// from Kafka (prism runner rebuild).
var ErrDamaged = errors.New("store damaged")

// checkTables opens every table file of the store at dir the way Badger's
// Open does, but on this goroutine and under recover. Badger opens tables
// on goroutines of its own, where a damaged one panics (reading past the
// end of a truncated file's mapping) and takes the whole process with it,
// every other mailbox included; checked here first, it is this store's
// error instead. It reads each table's index and its last block, about
// what Open itself reads, so opening costs up to twice as long.
func checkTables(dir string, bo badger.Options) error {
	names, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return fmt.Errorf("list tables in %s: %w", dir, err)
	}
	for _, name := range names {
		if err := checkTable(name, bo); err != nil {
			return fmt.Errorf("%w: table %s: %v", ErrDamaged, name, err)
		}
	}
	return nil
}

func checkTable(name string, bo badger.Options) (err error) {
	// A fault reading the mapping (a file shrunk under it) is a panic to
	// recover, not a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	mf, err := z.OpenMmapFile(name, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			// Badger's panics carry a multi-line dump: its first line says.
			msg, _, _ := strings.Cut(strings.TrimSpace(fmt.Sprint(p)), "\n")
			err = fmt.Errorf("unreadable: %s", msg)
		}
		_ = mf.Close(-1)
	}()
	_, err = table.OpenTable(mf, table.Options{BlockSize: bo.BlockSize, Compression: bo.Compression, ChkMode: options.NoVerification})
	return err
}
