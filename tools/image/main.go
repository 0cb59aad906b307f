// Command image builds Prism's OCI image without a container engine or a base
// image (`make image`): FROM scratch, a layer of users, CA certificates and
// directories, a layer with the static prism binary and prismctl, a symbolic
// link to it (prism is prismctl when run by that name), one image
// per platform under an image index, written as a tar that both OCI tools and
// docker load read. The same inputs give the same digest.
//
//	image build -out bin/prism-image.tar -ref ghcr.io/prism-mesh/prism:0.1.0 \
//	    -platform linux/amd64=bin/image/linux_amd64 -created $SOURCE_DATE_EPOCH ...
//	image check -archive bin/prism-image.tar -ref ghcr.io/prism-mesh/prism:0.1.0 -version v0.1.0 -chart helm/prism
//	image size -archive bin/prism-image.tar -ref ghcr.io/prism-mesh/prism:0.1.0 -platform linux/amd64
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|check|size [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = buildCmd(os.Args[2:])
	case "check":
		err = checkCmd(os.Args[2:])
	case "size":
		err = sizeCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build, check or size", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func buildCmd(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	var refs, platforms list
	out := fs.String("out", "bin/prism-image.tar", "the archive to write")
	fs.Var(&refs, "ref", "repository:tag to name the image (repeatable; the first is the main one)")
	fs.Var(&platforms, "platform", "os/arch[/variant]=DIR, DIR holding that platform's prism (repeatable)")
	ca := fs.String("ca", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates to ship")
	created := fs.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "creation time, seconds since the epoch (default $SOURCE_DATE_EPOCH)")
	version := fs.String("version", "dev", "org.opencontainers.image.version")
	revision := fs.String("revision", "", "org.opencontainers.image.revision (the commit)")
	source := fs.String("source", defaultSource, "org.opencontainers.image.source")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(refs) == 0 {
		return fmt.Errorf("-ref is required")
	}
	for _, r := range refs {
		if _, err := name.NewTag(r, name.StrictValidation); err != nil {
			return fmt.Errorf("-ref %q: %w", r, err)
		}
	}
	if *created == "" {
		return fmt.Errorf("-created or SOURCE_DATE_EPOCH is required: the image's time must not be the clock's, or no two builds agree")
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("-created %q: want seconds since the epoch: %w", *created, err)
	}
	spec := Spec{CACerts: *ca, Created: time.Unix(secs, 0).UTC(), Version: *version, Revision: *revision, Source: *source}
	for _, p := range platforms {
		pl, err := parsePlatform(p)
		if err != nil {
			return err
		}
		spec.Platforms = append(spec.Platforms, pl)
	}
	idx, err := Build(spec)
	if err != nil {
		return err
	}
	if err := WriteArchiveFile(*out, idx, refs, spec.Created); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	fmt.Printf("%s: %s %s (%s)\n", *out, strings.Join(refs, " "), d, platforms.String())
	return nil
}

func parsePlatform(s string) (Platform, error) {
	plat, dir, ok := strings.Cut(s, "=")
	parts := strings.Split(plat, "/")
	if !ok || dir == "" || len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Platform{}, fmt.Errorf("-platform %q: want os/arch[/variant]=DIR", s)
	}
	p := Platform{OS: parts[0], Arch: parts[1], BinDir: dir}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

func checkCmd(args []string) error {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	archive := fs.String("archive", "bin/prism-image.tar", "the archive to check")
	ref := fs.String("ref", "", "repository:tag the archive names (empty: its only one)")
	version := fs.String("version", "", "the version prism --version must print")
	chart := fs.String("chart", "", "a Helm chart whose default image the archive must be named")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "prism-image-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := Load(*archive, *ref, dir)
	if err != nil {
		return err
	}
	if err := sameImage(l); err != nil {
		return err
	}
	if *chart != "" {
		want, err := ChartImage(*chart)
		if err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		if !slices.Contains(l.Refs, want) {
			return fmt.Errorf("the chart %s runs %s by default, but the archive is named %s", *chart, want, strings.Join(l.Refs, ", "))
		}
	}
	im, err := l.Index.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		pimg, err := l.Index.Image(d.Digest)
		if err != nil {
			return err
		}
		if err := CheckLinks(pimg); err != nil {
			return fmt.Errorf("%s: %w", d.Platform, err)
		}
	}
	img, err := PlatformImage(l.Index, runtime.GOOS, runtime.GOARCH)
	if err != nil {
		return fmt.Errorf("cannot run this machine's binary: %w", err)
	}
	out, err := RunVersion(img, dir, *version)
	if err != nil {
		return err
	}
	d, err := l.Index.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s %s reads as an OCI layout and a docker archive; its %s/%s prism runs, as itself and as prismctl: %s\n",
		*archive, *ref, d, runtime.GOOS, runtime.GOARCH, out)
	return nil
}

// sameImage checks that docker load would get the same config and layers as
// the OCI layout's first platform.
func sameImage(l *Loaded) error {
	im, err := l.Index.IndexManifest()
	if err != nil {
		return err
	}
	oci, err := l.Index.Image(im.Manifests[0].Digest)
	if err != nil {
		return err
	}
	a, err := oci.ConfigName()
	if err != nil {
		return err
	}
	b, err := l.Docker.ConfigName()
	if err != nil {
		return err
	}
	if a != b {
		return fmt.Errorf("manifest.json names config %s, index.json's first image %s", b, a)
	}
	return nil
}

func sizeCmd(args []string) error {
	fs := flag.NewFlagSet("size", flag.ExitOnError)
	archive := fs.String("archive", "bin/prism-image.tar", "the archive to measure")
	ref := fs.String("ref", "", "repository:tag the archive names (empty: its only one)")
	platform := fs.String("platform", "linux/amd64", "os/arch of the image to measure")
	if err := fs.Parse(args); err != nil {
		return err
	}
	osName, arch, ok := strings.Cut(*platform, "/")
	if !ok {
		return fmt.Errorf("-platform %q: want os/arch", *platform)
	}
	dir, err := os.MkdirTemp("", "prism-image-size-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := Load(*archive, *ref, dir)
	if err != nil {
		return err
	}
	img, err := PlatformImage(l.Index, osName, arch)
	if err != nil {
		return err
	}
	s, err := ImageSizes(img)
	if err != nil {
		return err
	}
	fmt.Println(s.Compressed, s.Unpacked)
	return nil
}
