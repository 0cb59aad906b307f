package backup

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestFileRoundTrip(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 3, 10)
	info, data, err := Capture(f, fakeNode{"a1", 4}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetIndex() != f.AppliedIndex() || info.GetTerm() != 4 || info.GetNodeId() != "a1" || info.GetFsmFormat() != 1 ||
		info.GetNamespaceCount() != 10 || info.GetLeaseCount() != 10 || info.GetSessionCount() != 1 || info.GetProxyCount() != 1 {
		t.Fatalf("info = %v", info)
	}
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := WriteFile(path, info, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, gotData, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, info) || !bytes.Equal(gotData, data) {
		t.Fatal("read back differs from what was written")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("dir holds %d entries, want only the file (no temporary left)", len(entries))
	}
}

func TestReadRefusesDamagedFiles(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 3, 10)
	info, data, err := Capture(f, fakeNode{"a1", 3}, t0)
	if err != nil {
		t.Fatal(err)
	}
	var good bytes.Buffer
	if err := Write(&good, info, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	whole := good.Bytes()
	flipped := bytes.Clone(whole)
	flipped[len(flipped)-5] ^= 0xff
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"truncated", whole[:len(whole)-100], "truncated: the header announces"},
		{"cut in the header", whole[:len(Magic)+3], "header"},
		{"a flipped byte", flipped, "checksum mismatch"},
		{"trailing bytes", append(bytes.Clone(whole), 0), "bytes follow"},
		{"another file", []byte("PK\x03\x04 a zip file, not a snapshot"), "does not start with"},
		{"empty", nil, "does not start with"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Read(bytes.NewReader(c.file))
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrCorrupt saying %q", err, c.want)
			}
		})
	}
}

func TestWriteRefusesDataThatDoesNotMatchItsInfo(t *testing.T) {
	t.Parallel()
	f, _ := populate(t, 3, 4)
	info, data, err := Capture(f, fakeNode{"a1", 3}, t0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "s.snap")
	if err := WriteFile(path, info, bytes.NewReader(data[:len(data)-1])); err == nil {
		t.Fatal("a short stream was written")
	}
	altered := bytes.Clone(data)
	altered[len(altered)-1] ^= 1
	if err := WriteFile(path, info, bytes.NewReader(altered)); err == nil || !strings.Contains(err.Error(), "hashes to") {
		t.Fatalf("altered stream: err = %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("failed writes left %d files", len(entries))
	}
}
