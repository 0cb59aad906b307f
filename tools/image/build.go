package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The non-root user every container runs as: distroless's nonroot, so the
// chart's podSecurityContext (runAsUser/fsGroup 65532) and the Dockerfile's
// distroless base agree with this image.
const (
	nonrootUID  = 65532
	nonrootName = "nonroot"
	binDir      = "usr/local/bin"
	dataDir     = "var/lib/prism"
	caPath      = "etc/ssl/certs/ca-certificates.crt"
	// defaultSource is org.opencontainers.image.source.
	defaultSource = "https://github.com/prism-mesh/prism"
)

// entrypoint is the binary every platform directory must hold. It is also
// every name of links: prism dispatches on the name it was run by (busybox
// style), so prismctl is a symbolic link to it rather than a second binary
// holding nearly the same code.
const entrypoint = "prism"

var links = []string{"prismctl"}

// Platform is one os/arch of the image and the directory holding its
// statically linked prism.
type Platform struct {
	OS, Arch, Variant string
	BinDir            string
}

func (p Platform) String() string {
	if p.Variant != "" {
		return p.OS + "/" + p.Arch + "/" + p.Variant
	}
	return p.OS + "/" + p.Arch
}

// Spec is everything an image is made from. Nothing else (the clock, the
// files' times on disk, the user building it) reaches the image, so the same
// Spec over the same files gives the same digests.
type Spec struct {
	Platforms []Platform
	// CACerts is the PEM bundle copied to /etc/ssl/certs/ca-certificates.crt.
	CACerts string
	// Created stamps the config, the history and every file's mtime:
	// SOURCE_DATE_EPOCH, or the commit's time.
	Created  time.Time
	Version  string
	Revision string
	Source   string
}

// Labels are the OCI annotations every image config carries.
func (s Spec) Labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "prism",
		"org.opencontainers.image.description": "Prism mailbox mesh: prism (admin, runner, sidecar, gateway, inject) and prismctl",
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
	}
}

// Build makes an OCI image index with one image per platform. The images
// share their first layer (users, CA certificates, directories); the second
// holds the platform's prism and the links to it.
func Build(s Spec) (v1.ImageIndex, error) {
	if len(s.Platforms) == 0 {
		return nil, fmt.Errorf("no platform to build")
	}
	ca, err := os.ReadFile(s.CACerts)
	if err != nil {
		return nil, fmt.Errorf("read CA certificates: %w", err)
	}
	base, err := layer(baseFiles(ca), s.Created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range s.Platforms {
		img, err := buildImage(s, p, base)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: p.OS, Architecture: p.Arch, Variant: p.Variant},
			},
		})
	}
	return idx, nil
}

func buildImage(s Spec, p Platform, base v1.Layer) (v1.Image, error) {
	files := []file{
		{path: "usr", mode: 0o755, dir: true},
		{path: "usr/local", mode: 0o755, dir: true},
		{path: binDir, mode: 0o755, dir: true},
	}
	data, err := os.ReadFile(filepath.Join(p.BinDir, entrypoint))
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	files = append(files, file{path: binDir + "/" + entrypoint, mode: 0o755, data: data})
	for _, l := range links {
		files = append(files, file{path: binDir + "/" + l, mode: 0o777, link: entrypoint})
	}
	bins, err := layer(files, s.Created)
	if err != nil {
		return nil, fmt.Errorf("binaries layer: %w", err)
	}
	created := v1.Time{Time: s.Created.UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "tools/image: /etc/passwd, /etc/group (nonroot 65532), CA certificates, /tmp, /var/lib/prism",
		}},
		mutate.Addendum{Layer: bins, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "tools/image: /usr/local/bin/prism (CGO_ENABLED=0), /usr/local/bin/prismctl -> prism",
		}},
	)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Arch, p.Variant
	cf.Created = created
	cf.Config = imageConfig(s)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// imageConfig is how every container of the image runs; the Dockerfile says
// the same (TestDockerfileInStep).
func imageConfig(s Spec) v1.Config {
	return v1.Config{
		User:       fmt.Sprintf("%d:%d", nonrootUID, nonrootUID),
		Entrypoint: []string{"/" + binDir + "/" + entrypoint},
		WorkingDir: "/" + dataDir,
		Env: []string{
			"PATH=/" + binDir + ":/usr/bin:/bin",
			"SSL_CERT_FILE=/" + caPath,
		},
		Labels: s.Labels(),
	}
}

// baseFiles is a minimal root filesystem for a static Go binary, laid out as
// distroless/static's: users, CA certificates, a sticky /tmp, and the data
// directory the chart mounts, owned by nonroot so it is writable without a
// volume too.
func baseFiles(ca []byte) []file {
	return []file{
		{path: "etc", mode: 0o755, dir: true},
		{path: "etc/passwd", mode: 0o644, data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				fmt.Sprintf("%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", nonrootName, nonrootUID, nonrootUID, nonrootName, nonrootName))},
		{path: "etc/group", mode: 0o644, data: []byte(
			"root:x:0:\nnobody:x:65534:\n" + fmt.Sprintf("%s:x:%d:\n", nonrootName, nonrootUID))},
		// Go's resolver reads it; files before DNS as everywhere else.
		{path: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{path: "etc/ssl", mode: 0o755, dir: true},
		{path: "etc/ssl/certs", mode: 0o755, dir: true},
		{path: caPath, mode: 0o644, data: ca},
		{path: "home", mode: 0o755, dir: true},
		{path: "home/" + nonrootName, mode: 0o700, dir: true, owner: nonrootUID},
		{path: "root", mode: 0o700, dir: true},
		{path: "tmp", mode: 0o1777, dir: true},
		{path: "var", mode: 0o755, dir: true},
		{path: "var/lib", mode: 0o755, dir: true},
		{path: dataDir, mode: 0o755, dir: true, owner: nonrootUID},
	}
}

// file is one entry of a layer; owner is both its uid and gid. A file with a
// link is a symbolic link to that path.
type file struct {
	path  string
	mode  int64
	dir   bool
	owner int
	data  []byte
	link  string
}

// layer writes files as a tar in path order, every header fixed (mtime,
// owner, no user or group names) so the bytes depend on the files alone, and
// compresses it once with gzip, whose output is fixed for a given input and
// level (the header has no name or time).
func layer(files []file, mtime time.Time) (v1.Layer, error) {
	sorted := append([]file(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].path < sorted[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		h := &tar.Header{
			Name:    f.path,
			Mode:    f.mode,
			Uid:     f.owner,
			Gid:     f.owner,
			ModTime: mtime.UTC().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.path, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	var zbuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&zbuf, gzip.BestCompression)
	if err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	if _, err := zw.Write(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	compressed := zbuf.Bytes()
	// Given gzip, tarball keeps these bytes as the blob rather than
	// compressing again.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
