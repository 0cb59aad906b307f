package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// WriteArchive writes idx as one tar that is both an OCI image layout
// (oci-layout, index.json, blobs/sha256/...) and a `docker save` archive
// (manifest.json naming the first platform's config and layers in the same
// blobs), as Docker 25 saves images: docker load, podman load, crane push,
// skopeo copy oci-archive: and kind load image-archive all read it. Each
// name in refs ("repo:tag") tags the index in index.json and the first
// platform's image in manifest.json (a docker save archive has no index).
// Entries are in a fixed order with fixed headers, so equal images give
// equal bytes.
func WriteArchive(w io.Writer, idx v1.ImageIndex, refs []string, mtime time.Time) error {
	blobs := map[v1.Hash][]byte{}
	raw, err := idx.RawManifest()
	if err != nil {
		return fmt.Errorf("index manifest: %w", err)
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("index digest: %w", err)
	}
	blobs[idxDigest] = raw
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("index manifest: %w", err)
	}
	var first *dockerManifest
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return fmt.Errorf("image %s: %w", desc.Digest, err)
		}
		dm, err := addImageBlobs(blobs, img)
		if err != nil {
			return fmt.Errorf("image %s: %w", desc.Digest, err)
		}
		if first == nil {
			first = dm
		}
	}
	if first == nil {
		return fmt.Errorf("index has no image")
	}
	first.RepoTags = refs

	top := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, ref := range refs {
		tag := ref[strings.LastIndex(ref, ":")+1:]
		top.Manifests = append(top.Manifests, v1.Descriptor{
			MediaType: types.OCIImageIndex,
			Digest:    idxDigest,
			Size:      int64(len(raw)),
			Annotations: map[string]string{
				// containerd (and so docker load) names the image from the
				// first, podman and skopeo from the second.
				"io.containerd.image.name":          ref,
				"org.opencontainers.image.ref.name": tag,
			},
		})
	}
	indexJSON, err := json.Marshal(top)
	if err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	manifestJSON, err := json.Marshal([]*dockerManifest{first})
	if err != nil {
		return fmt.Errorf("manifest.json: %w", err)
	}

	tw := tar.NewWriter(w)
	mt := mtime.UTC().Truncate(time.Second)
	put := func(name string, data []byte) error {
		h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: mt, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		return nil
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mt, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("write %s: %w", dir, err)
		}
	}
	digests := make([]v1.Hash, 0, len(blobs))
	for h := range blobs {
		digests = append(digests, h)
	}
	sort.Slice(digests, func(i, j int) bool { return digests[i].Hex < digests[j].Hex })
	for _, h := range digests {
		if err := put(blobPath(h), blobs[h]); err != nil {
			return err
		}
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", indexJSON); err != nil {
		return err
	}
	if err := put("manifest.json", manifestJSON); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("close tar: %w", err)
	}
	return nil
}

// WriteArchiveFile writes the archive next to path and renames it into place,
// so a failed build leaves no half-written image behind.
func WriteArchiveFile(path string, idx v1.ImageIndex, refs []string, mtime time.Time) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".prism-image-*.tar")
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := WriteArchive(tmp, idx, refs, mtime); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	return nil
}

// dockerManifest is one entry of a docker save archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

func addImageBlobs(blobs map[v1.Hash][]byte, img v1.Image) (*dockerManifest, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("digest: %w", err)
	}
	blobs[d] = raw
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cd, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("config digest: %w", err)
	}
	blobs[cd] = cfg
	dm := &dockerManifest{Config: blobPath(cd)}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("layer digest: %w", err)
		}
		if _, ok := blobs[ld]; !ok {
			rc, err := l.Compressed()
			if err != nil {
				return nil, fmt.Errorf("layer %s: %w", ld, err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return nil, fmt.Errorf("layer %s: %w", ld, err)
			}
			blobs[ld] = data
		}
		dm.Layers = append(dm.Layers, blobPath(ld))
	}
	return dm, nil
}
