package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Loaded is an archive read back the two ways a runtime reads it.
type Loaded struct {
	// Index is read from the OCI layout (index.json), as containerd, podman
	// and skopeo read it.
	Index v1.ImageIndex
	// Docker is read from manifest.json under ref, as docker load reads it.
	Docker v1.Image
	// Refs are the names index.json gives the image.
	Refs []string
}

// Load unpacks the archive at path into dir and opens it both ways; docker's
// way by ref, or the only image manifest.json names if ref is empty.
func Load(path, ref, dir string) (*Loaded, error) {
	if err := untar(path, dir); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", path, err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout: %w", err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index.json: %w", err)
	}
	if len(im.Manifests) == 0 {
		return nil, fmt.Errorf("index.json names no image")
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("read image index: %w", err)
	}
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("ref %q: %w", ref, err)
		}
		tag = &t
	}
	docker, err := tarball.ImageFromPath(path, tag)
	if err != nil {
		return nil, fmt.Errorf("read manifest.json: %w", err)
	}
	l := &Loaded{Index: idx, Docker: docker}
	for _, d := range im.Manifests {
		if d.Digest != im.Manifests[0].Digest {
			return nil, fmt.Errorf("index.json names two images, %s and %s", im.Manifests[0].Digest, d.Digest)
		}
		l.Refs = append(l.Refs, d.Annotations["io.containerd.image.name"])
	}
	return l, nil
}

// PlatformImage is the image of idx for os/arch.
func PlatformImage(idx v1.ImageIndex, os, arch string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index manifest: %w", err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == os && d.Platform.Architecture == arch {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no image for %s/%s", os, arch)
}

// ExtractFile copies the file at path (no leading slash) of img's flattened
// filesystem to dst.
func ExtractFile(img v1.Image, path, dst string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s is not in the image", path)
		}
		if err != nil {
			return fmt.Errorf("read image filesystem: %w", err)
		}
		if strings.TrimPrefix(h.Name, "/") != path {
			continue
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return fmt.Errorf("extract %s: %w", path, err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return fmt.Errorf("extract %s: %w", path, err)
		}
		return f.Close()
	}
}

// CheckLinks checks that every name of links is, in img's flattened
// filesystem, a symbolic link to the entrypoint binary beside it: a link
// whose target is missing would leave prismctl absent from the image.
func CheckLinks(img v1.Image) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	kinds, targets := map[string]byte{}, map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read image filesystem: %w", err)
		}
		name := strings.TrimPrefix(h.Name, "/")
		kinds[name], targets[name] = h.Typeflag, h.Linkname
	}
	bin := binDir + "/" + entrypoint
	if kinds[bin] != tar.TypeReg {
		return fmt.Errorf("/%s is not a file in the image", bin)
	}
	for _, l := range links {
		p := binDir + "/" + l
		if kinds[p] != tar.TypeSymlink {
			return fmt.Errorf("/%s is not a symbolic link in the image", p)
		}
		if t := targets[p]; path.Clean(path.Join(binDir, t)) != bin && t != "/"+bin {
			return fmt.Errorf("/%s links to %s, want /%s", p, t, bin)
		}
	}
	return nil
}

// RunVersion runs the image's entrypoint with --version on this machine (no
// container runtime: the binary is static) and checks that it names version;
// then runs it under each name of links as the image's link does, and checks
// that it is prismctl, printing the same version (version --client). It
// returns what each printed, one line each.
func RunVersion(img v1.Image, dir, version string) (string, error) {
	bin := filepath.Join(dir, entrypoint)
	if err := ExtractFile(img, binDir+"/"+entrypoint, bin); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("prism --version: %w: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "prism version "+version {
		return got, fmt.Errorf("prism --version printed %q, want %q", got, "prism version "+version)
	}
	printed := []string{strings.TrimSpace(string(out))}
	for _, l := range links {
		link := filepath.Join(dir, l)
		if err := os.Symlink(entrypoint, link); err != nil {
			return "", fmt.Errorf("link %s: %w", l, err)
		}
		out, err := exec.CommandContext(ctx, link, "version", "--client").CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("%s version --client: %w: %s", l, err, out)
		}
		got := strings.TrimSpace(string(out))
		if f := strings.Fields(got); len(f) < 2 || f[0] != "client" || f[1] != version {
			return got, fmt.Errorf("%s version --client printed %q, want client %s", l, got, version)
		}
		printed = append(printed, l+": "+got)
	}
	return strings.Join(printed, "; "), nil
}

// Sizes of one platform's image: what a node pulls (manifest, config and
// compressed layers) and what it takes once unpacked (the layers' tars, as
// docker images reports).
type Sizes struct {
	Compressed, Unpacked int64
}

// ImageSizes adds up img's blobs.
func ImageSizes(img v1.Image) (Sizes, error) {
	var s Sizes
	m, err := img.Manifest()
	if err != nil {
		return s, fmt.Errorf("manifest: %w", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return s, fmt.Errorf("manifest: %w", err)
	}
	s.Compressed = int64(len(raw)) + m.Config.Size
	layers, err := img.Layers()
	if err != nil {
		return s, fmt.Errorf("layers: %w", err)
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return s, fmt.Errorf("layer size: %w", err)
		}
		s.Compressed += n
		rc, err := l.Uncompressed()
		if err != nil {
			return s, fmt.Errorf("layer: %w", err)
		}
		u, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return s, fmt.Errorf("layer: %w", err)
		}
		s.Unpacked += u
	}
	return s, nil
}

func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(dst, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.Create(dst)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: unexpected type %c", h.Name, h.Typeflag)
		}
	}
}

// ChartImage is the image the chart in dir runs by default: image.repository
// and image.tag of values.yaml, the tag defaulting to Chart.yaml's appVersion
// as the chart's prism.image helper does. It reads the two keys line by line
// rather than parsing YAML: both are plain scalars at fixed places.
func ChartImage(dir string) (string, error) {
	values, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return "", err
	}
	var repo, tag string
	inImage := false
	for _, line := range strings.Split(string(values), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			inImage = strings.TrimSpace(line) == "image:"
			continue
		}
		if !inImage || strings.HasPrefix(line, "   ") {
			continue
		}
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "repository":
			repo = unquote(v)
		case "tag":
			tag = unquote(v)
		}
	}
	if repo == "" {
		return "", fmt.Errorf("%s/values.yaml has no image.repository", dir)
	}
	if tag == "" {
		chart, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(string(chart), "\n") {
			if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
				tag = unquote(v)
			}
		}
		if tag == "" {
			return "", fmt.Errorf("%s: image.tag is empty and Chart.yaml has no appVersion", dir)
		}
	}
	return repo + ":" + tag, nil
}

func unquote(v string) string {
	v, _, _ = strings.Cut(v, " #")
	return strings.Trim(strings.TrimSpace(v), `"'`)
}
