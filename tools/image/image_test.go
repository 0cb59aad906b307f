package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const testVersion = "v1.2.3-4-gabcdef0"

var testCreated = time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)

// fakePlatforms writes small stand-ins for prism: shell scripts, so the
// host's one runs like the real prism --version, and as prismctl like
// prismctl version --client, without a Go build.
func fakePlatforms(t *testing.T, root, version string) []Platform {
	t.Helper()
	return fakePlatformsScript(t, root, "case \"${0##*/}\" in\n"+
		"prismctl) printf 'client\\t%s\\t(go1, linux/%s)\\n' \""+version+"\" \"$ARCH\" ;;\n"+
		"*) echo \"prism version "+version+"\" ;;\n"+
		"esac\n")
}

// fakePlatformsScript writes body as each platform's prism, after a line
// setting ARCH to the platform's.
func fakePlatformsScript(t *testing.T, root, body string) []Platform {
	t.Helper()
	var ps []Platform
	for _, arch := range []string{"amd64", "arm64"} {
		dir := filepath.Join(root, "linux_"+arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		script := "#!/bin/sh\nARCH=" + arch + "\n" + body
		if err := os.WriteFile(filepath.Join(dir, entrypoint), []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, Platform{OS: "linux", Arch: arch, BinDir: dir})
	}
	return ps
}

func testSpec(t *testing.T, root string) Spec {
	t.Helper()
	ca := filepath.Join(root, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Platforms: fakePlatforms(t, root, testVersion),
		CACerts:   ca,
		Created:   testCreated,
		Version:   testVersion,
		Revision:  "abcdef0123456789abcdef0123456789abcdef01",
		Source:    "https://github.com/prism-mesh/prism",
	}
}

func TestBuildConfig(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, t.TempDir())
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 2 {
		t.Fatalf("index: media type %s, %d manifests; want an OCI index of 2", im.MediaType, len(im.Manifests))
	}
	for i, p := range spec.Platforms {
		d := im.Manifests[i]
		if d.Platform == nil || d.Platform.OS != p.OS || d.Platform.Architecture != p.Arch {
			t.Errorf("manifest %d platform %+v, want %s", i, d.Platform, p)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
			t.Errorf("%s: manifest %s config %s, want OCI media types", p, m.MediaType, m.Config.MediaType)
		}
		for _, l := range m.Layers {
			if l.MediaType != types.OCILayer {
				t.Errorf("%s: layer media type %s, want %s", p, l.MediaType, types.OCILayer)
			}
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		for _, tc := range []struct{ what, got, want string }{
			{"os", cf.OS, p.OS},
			{"architecture", cf.Architecture, p.Arch},
			{"created", cf.Created.UTC().Format(time.RFC3339), "2026-05-04T03:02:01Z"},
			{"user", c.User, "65532:65532"},
			{"entrypoint", strings.Join(c.Entrypoint, " "), "/usr/local/bin/prism"},
			{"cmd", strings.Join(c.Cmd, " "), ""},
			{"working dir", c.WorkingDir, "/var/lib/prism"},
			{"env", strings.Join(c.Env, " "), "PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			{"label source", c.Labels["org.opencontainers.image.source"], "https://github.com/prism-mesh/prism"},
			{"label version", c.Labels["org.opencontainers.image.version"], testVersion},
			{"label revision", c.Labels["org.opencontainers.image.revision"], spec.Revision},
			{"label created", c.Labels["org.opencontainers.image.created"], "2026-05-04T03:02:01Z"},
		} {
			if tc.got != tc.want {
				t.Errorf("%s: %s = %q, want %q", p, tc.what, tc.got, tc.want)
			}
		}
		if len(cf.History) != 2 || len(cf.RootFS.DiffIDs) != 2 {
			t.Errorf("%s: %d history entries, %d layers; want 2 of each", p, len(cf.History), len(cf.RootFS.DiffIDs))
		}
	}
}

// entry is what a file of the image's filesystem looks like from inside.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
}

func TestBuildFiles(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, t.TempDir())
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir, reg, sym := byte(tar.TypeDir), byte(tar.TypeReg), byte(tar.TypeSymlink)
	want := map[string]entry{
		"etc":                               {dir, 0o755, 0, 0},
		"etc/group":                         {reg, 0o644, 0, 0},
		"etc/nsswitch.conf":                 {reg, 0o644, 0, 0},
		"etc/passwd":                        {reg, 0o644, 0, 0},
		"etc/ssl":                           {dir, 0o755, 0, 0},
		"etc/ssl/certs":                     {dir, 0o755, 0, 0},
		"etc/ssl/certs/ca-certificates.crt": {reg, 0o644, 0, 0},
		"home":                              {dir, 0o755, 0, 0},
		"home/nonroot":                      {dir, 0o700, 65532, 65532},
		"root":                              {dir, 0o700, 0, 0},
		"tmp":                               {dir, 0o1777, 0, 0},
		"usr":                               {dir, 0o755, 0, 0},
		"usr/local":                         {dir, 0o755, 0, 0},
		"usr/local/bin":                     {dir, 0o755, 0, 0},
		"usr/local/bin/prism":               {reg, 0o755, 0, 0},
		"usr/local/bin/prismctl":            {sym, 0o777, 0, 0},
		"var":                               {dir, 0o755, 0, 0},
		"var/lib":                           {dir, 0o755, 0, 0},
		"var/lib/prism":                     {dir, 0o755, 65532, 65532},
	}
	for _, p := range spec.Platforms {
		img, err := PlatformImage(idx, p.OS, p.Arch)
		if err != nil {
			t.Fatal(err)
		}
		got, contents := flatten(t, img)
		for path, w := range want {
			if g, ok := got[path]; !ok {
				t.Errorf("%s: /%s missing", p, path)
			} else if g != w {
				t.Errorf("%s: /%s is %+v, want %+v", p, path, g, w)
			}
		}
		for path := range got {
			if _, ok := want[path]; !ok {
				t.Errorf("%s: unexpected /%s", p, path)
			}
		}
		disk, err := os.ReadFile(filepath.Join(p.BinDir, entrypoint))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(contents["usr/local/bin/prism"], disk) {
			t.Errorf("%s: /usr/local/bin/prism is not %s's binary", p, p.BinDir)
		}
		if got := string(contents["usr/local/bin/prismctl"]); got != "prism" {
			t.Errorf("%s: /usr/local/bin/prismctl links to %q, want prism", p, got)
		}
		if err := CheckLinks(img); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		ca, err := os.ReadFile(spec.CACerts)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(contents["etc/ssl/certs/ca-certificates.crt"], ca) {
			t.Errorf("%s: CA bundle differs from %s", p, spec.CACerts)
		}
		if !strings.Contains(string(contents["etc/passwd"]), "\nnonroot:x:65532:65532:") ||
			!strings.Contains(string(contents["etc/group"]), "\nnonroot:x:65532:\n") {
			t.Errorf("%s: no nonroot 65532 in /etc/passwd or /etc/group:\n%s%s", p, contents["etc/passwd"], contents["etc/group"])
		}
	}
}

// flatten lists img's filesystem and the contents of each entry: a file's
// bytes, a symbolic link's target.
func flatten(t *testing.T, img v1.Image) (map[string]entry, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files, contents := map[string]entry{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		p := strings.TrimSuffix(strings.TrimPrefix(h.Name, "/"), "/")
		files[p] = entry{h.Typeflag, h.Mode, h.Uid, h.Gid}
		if !h.ModTime.Equal(testCreated) {
			t.Errorf("/%s mtime %s, want the spec's %s", p, h.ModTime, testCreated)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			contents[p] = data
		case tar.TypeSymlink:
			contents[p] = []byte(h.Linkname)
		}
	}
}

func archiveBytes(t *testing.T, spec Spec, refs []string) ([]byte, v1.Hash) {
	t.Helper()
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, idx, refs, spec.Created); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), d
}

func TestReproducible(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	spec := testSpec(t, root)
	refs := []string{"ghcr.io/prism-mesh/prism:0.1.0"}
	first, d1 := archiveBytes(t, spec, refs)

	// What reaches the disk differently between two checkouts (times,
	// permissions) must not reach the image.
	later := time.Now().Add(time.Hour)
	for _, p := range spec.Platforms {
		f := filepath.Join(p.BinDir, entrypoint)
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	second, d2 := archiveBytes(t, spec, refs)
	if d1 != d2 || !bytes.Equal(first, second) {
		t.Fatalf("two builds of the same inputs differ: %s (%d bytes) and %s (%d bytes)", d1, len(first), d2, len(second))
	}

	// A changed input changes the digest: each one is really in the image.
	newer := spec
	newer.Created = testCreated.Add(time.Second)
	if _, d := archiveBytes(t, newer, refs); d == d1 {
		t.Errorf("another creation time gives the same digest %s", d)
	}
	relabelled := spec
	relabelled.Revision = "0000000000000000000000000000000000000000"
	if _, d := archiveBytes(t, relabelled, refs); d == d1 {
		t.Errorf("another revision gives the same digest %s", d)
	}
}

// TestBaseLayerShared: a new binary changes only the binaries layer, so a
// node that has an older image pulls just that.
func TestBaseLayerShared(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	spec := testSpec(t, root)
	layers := func() []v1.Hash {
		idx, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		var hs []v1.Hash
		for _, p := range spec.Platforms {
			img, err := PlatformImage(idx, p.OS, p.Arch)
			if err != nil {
				t.Fatal(err)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range m.Layers {
				hs = append(hs, l.Digest)
			}
		}
		return hs
	}
	before := layers()
	if before[0] != before[2] {
		t.Errorf("the platforms' base layers differ: %s and %s", before[0], before[2])
	}
	fakePlatforms(t, root, "v9.9.9")
	after := layers()
	if after[0] != before[0] {
		t.Errorf("base layer changed with the binaries: %s -> %s", before[0], after[0])
	}
	if after[1] == before[1] {
		t.Errorf("binaries layer %s did not change with the binaries", after[1])
	}
}

func TestArchiveLoads(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	spec := testSpec(t, root)
	refs := []string{"ghcr.io/prism-mesh/prism:0.1.0", "ghcr.io/prism-mesh/prism:" + testVersion}
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "out", "prism-image.tar")
	if err := WriteArchiveFile(path, idx, refs, spec.Created); err != nil {
		t.Fatal(err)
	}
	// "" reads manifest.json's only image, as docker load does.
	for _, ref := range append([]string{""}, refs...) {
		l, err := Load(path, ref, t.TempDir())
		if err != nil {
			t.Fatalf("load %s: %v", ref, err)
		}
		if !slices.Equal(l.Refs, refs) {
			t.Errorf("index.json names %v, want %v", l.Refs, refs)
		}
		want, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := l.Index.Digest(); err != nil || got != want {
			t.Errorf("OCI layout index %s (%v), want %s", got, err, want)
		}
		if err := sameImage(l); err != nil {
			t.Error(err)
		}
		cf, err := l.Docker.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != spec.Platforms[0].Arch || cf.Config.User != "65532:65532" {
			t.Errorf("docker archive image is %s as %q, want %s as 65532:65532", cf.Architecture, cf.Config.User, spec.Platforms[0].Arch)
		}
	}
}

func TestRunVersion(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skipf("the fake binaries are built for linux/amd64 and linux/arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	spec := testSpec(t, t.TempDir())
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	img, err := PlatformImage(idx, runtime.GOOS, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	want := "prism version " + testVersion + "; prismctl: client\t" + testVersion + "\t(go1, " + runtime.GOOS + "/" + runtime.GOARCH + ")"
	out, err := RunVersion(img, t.TempDir(), testVersion)
	if err != nil || out != want {
		t.Errorf("RunVersion = %q, %v; want %q", out, err, want)
	}
	if _, err := RunVersion(img, t.TempDir(), "v0.0.0"); err == nil {
		t.Error("RunVersion accepted a binary printing another version")
	}

	// A prism that is not prismctl under that name fails the check.
	spec.Platforms = fakePlatformsScript(t, t.TempDir(), "echo \"prism version "+testVersion+"\"\n")
	if idx, err = Build(spec); err != nil {
		t.Fatal(err)
	}
	if img, err = PlatformImage(idx, runtime.GOOS, runtime.GOARCH); err != nil {
		t.Fatal(err)
	}
	if out, err := RunVersion(img, t.TempDir(), testVersion); err == nil {
		t.Errorf("RunVersion accepted a prism that is not prismctl when run by that name: %q", out)
	}
}

// TestCheckLinks: an image whose prismctl is missing, a file of its own or a
// link elsewhere fails the check.
func TestCheckLinks(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, t.TempDir())
	for _, tc := range []struct {
		name  string
		files []file
		ok    bool
	}{
		{"relative link", []file{{path: binDir + "/prism", mode: 0o755, data: []byte("x")}, {path: binDir + "/prismctl", mode: 0o777, link: "prism"}}, true},
		{"absolute link", []file{{path: binDir + "/prism", mode: 0o755, data: []byte("x")}, {path: binDir + "/prismctl", mode: 0o777, link: "/" + binDir + "/prism"}}, true},
		{"no prismctl", []file{{path: binDir + "/prism", mode: 0o755, data: []byte("x")}}, false},
		{"prismctl a copy", []file{{path: binDir + "/prism", mode: 0o755, data: []byte("x")}, {path: binDir + "/prismctl", mode: 0o755, data: []byte("x")}}, false},
		{"link elsewhere", []file{{path: binDir + "/prism", mode: 0o755, data: []byte("x")}, {path: binDir + "/prismctl", mode: 0o777, link: "/bin/prism"}}, false},
		{"no prism", []file{{path: binDir + "/prismctl", mode: 0o777, link: "prism"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := layer(tc.files, spec.Created)
			if err != nil {
				t.Fatal(err)
			}
			img, err := mutate.AppendLayers(empty.Image, l)
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckLinks(img); (err == nil) != tc.ok {
				t.Errorf("CheckLinks = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestChartImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, values, chart, want string
	}{
		{
			name:   "tag defaults to appVersion",
			values: "# top\nimage:\n  # -- Image repository.\n  repository: ghcr.io/prism-mesh/prism\n  # -- empty: appVersion\n  tag: \"\"\n  pullPolicy: IfNotPresent\nother:\n  repository: elsewhere/envoy\n  tag: v1\n",
			chart:  "name: prism\nversion: 0.1.0\nappVersion: \"0.2.0\"\n",
			want:   "ghcr.io/prism-mesh/prism:0.2.0",
		},
		{
			name:   "explicit tag; nested image blocks ignored",
			values: "gateway:\n  image:\n    repository: envoyproxy/envoy\n    tag: v1.31\nimage:\n  repository: 'example.com/prism' # mirror\n  tag: v7\n",
			chart:  "appVersion: 0.1.0\n",
			want:   "example.com/prism:v7",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "values.yaml"), []byte(tc.values), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte(tc.chart), 0o600); err != nil {
				t.Fatal(err)
			}
			if got, err := ChartImage(dir); err != nil || got != tc.want {
				t.Errorf("ChartImage = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// The real chart: make image names its archive after this.
	got, err := ChartImage("../../helm/prism")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "ghcr.io/prism-mesh/prism:") {
		t.Errorf("the chart's default image is %s, not the ghcr.io/prism-mesh/prism that make image builds", got)
	}
}

func TestParsePlatform(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Platform
		ok   bool
	}{
		{"linux/amd64=bin/a", Platform{OS: "linux", Arch: "amd64", BinDir: "bin/a"}, true},
		{"linux/arm64/v8=b", Platform{OS: "linux", Arch: "arm64", Variant: "v8", BinDir: "b"}, true},
		{"linux/amd64", Platform{}, false},
		{"linux=bin", Platform{}, false},
		{"linux/amd64=", Platform{}, false},
		{"a/b/c/d=x", Platform{}, false},
	} {
		got, err := parsePlatform(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parsePlatform(%q) = %+v, %v; want %+v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
