package store

import (
	"context"
	"slices"
	"testing"
)

func openDB(t *testing.T, dir string) *DB {
	t.Helper()
	db, err := OpenDB(DBOptions{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatalf("open database %s: %v", dir, err)
	}
	return db
}

func openIn(t *testing.T, db *DB, id string) *Store {
	t.Helper()
	s, err := db.Open(Options{ID: id, Logger: quiet})
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	return s
}

// TestDBMailboxes checks a database's mailboxes: each store holds only its own items, IDs lists them, one
// dropped is empty when opened again while the others are untouched, and all of it survives a reopen.
func TestDBMailboxes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	for _, id := range []string{"a@p", "b/x@p", "c@p"} {
		s := openIn(t, db, id)
		mustWrite(t, s, item(id+"-1", 1000), item(id+"-2", 2000))
		if _, err := db.Open(Options{ID: id}); err == nil {
			t.Errorf("%s opened twice", id)
		}
		if err := db.Drop(id); err == nil {
			t.Errorf("%s dropped while open", id)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Open(Options{ID: "d@p", Dir: dir}); err == nil {
		t.Error("a store opened through a database took a Dir of its own")
	}
	if err := db.Drop("b/x@p"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	listed, err := db.IDs()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a@p", "c@p"}; !slices.Equal(listed, want) {
		t.Errorf("IDs after a drop and a reopen = %v, want %v", listed, want)
	}
	for _, tc := range []struct {
		id   string
		want []string
	}{
		{"a@p", []string{"a@p-2@2000", "a@p-1@1000"}},
		{"b/x@p", nil},
		{"c@p", []string{"c@p-2@2000", "c@p-1@1000"}},
	} {
		s := openIn(t, db, tc.id)
		resp, err := s.Query(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(resp.GetItems()); !slices.Equal(got, tc.want) {
			t.Errorf("%s holds %v, want %v", tc.id, got, tc.want)
		}
		if st := s.Usage(); st.Events != int64(len(tc.want)) {
			t.Errorf("%s counts %d events, want %d", tc.id, st.Events, len(tc.want))
		}
	}
}
