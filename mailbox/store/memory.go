package store

import (
	badger "github.com/dgraph-io/badger/v4"
)

// Memory is what one Badger database may hold in memory, beside the value log and tables it maps (page cache,
// which the kernel reclaims). A runner has one database (DB) for all its mailboxes and gives it
// MemoryFor(budget, 1); Open alone gives its private database the Options' Memory. Badger keeps up to NumMemtables memtables (the one written and those waiting
// to be flushed), so memtables take NumMemtables × MemTableSize.
type Memory struct {
	MemTableSize int64 // bytes per memtable; Badger's default 64 MiB
	NumMemtables int   // Badger's default 5
	// BlockCacheSize caches decompressed table blocks (Badger compresses them with Snappy); Badger's default
	// 256 MiB.
	BlockCacheSize int64
	// IndexCacheSize caches table indexes and bloom filters; 0 keeps all of them in memory, which grows with
	// the store (Badger's default).
	IndexCacheSize int64
}

// Bounds of MemoryFor's sizes. A transaction holds at most 15% of a memtable (Badger's limit): a 4 MiB memtable
// still takes a write batch of about 1,500 events in one transaction (a larger one is split in halves,
// write.go, and written without pipelining: slower, never refused). Below 1 MiB the caches would hold too few
// blocks and indexes to be worth their bookkeeping.
const (
	minMemTable = 4 << 20
	maxMemTable = 64 << 20
	minCache    = 1 << 20
	memtables   = 3
)

// MemoryFor divides budget, the bytes a runner may use, among stores open stores: Badger gets half of it (the
// rest is the Go heap's: batches in flight, query pages, Kafka's buffers), and each store an equal share:
// 3 memtables take 40% of a share, the block cache 35% and the index cache 25%. A budget of 0 (or less) is no
// budget: Badger's defaults. Memtables are never smaller than 4 MiB: where that floor takes more than 40% of a
// share, the caches get what is left of it (in the same proportion), so a store stays within its share down to
// the floors of all three; a tight budget over many stores is exceeded rather than made unusable, and
// GOMEMLIMIT (which the runner sets to the budget) then makes the Go heap give way.
func MemoryFor(budget int64, stores int) Memory {
	if budget <= 0 {
		return Memory{}
	}
	share := budget / 2 / int64(max(stores, 1))
	memTable := min(max(share*4/10/memtables, minMemTable), maxMemTable)
	rest := share - memtables*memTable
	return Memory{
		MemTableSize:   memTable,
		NumMemtables:   memtables,
		BlockCacheSize: max(min(share*35/100, rest*35/60), minCache),
		IndexCacheSize: max(min(share*25/100, rest*25/60), minCache),
	}
}

func (m Memory) apply(bo badger.Options) badger.Options {
	if m.MemTableSize > 0 {
		bo = bo.WithMemTableSize(m.MemTableSize)
	}
	if m.NumMemtables > 0 {
		bo = bo.WithNumMemtables(m.NumMemtables)
	}
	if m.BlockCacheSize > 0 {
		bo = bo.WithBlockCacheSize(m.BlockCacheSize)
	}
	if m.IndexCacheSize > 0 {
		bo = bo.WithIndexCacheSize(m.IndexCacheSize)
	}
	return bo
}
