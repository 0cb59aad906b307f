// Command diskbench measures how fast a runner's ingest comes back after its
// disk was full: on a tmpfs it mounts (root only), a runner with a 16 MiB
// free-space watermark stores a first load, a ballast file takes the disk
// below the watermark, more events are produced and held, then the ballast
// is removed. The figure is the time from the removal to the first held
// event stored, the median of -runs rounds, with the runner's defaults: a
// held ingest looks at the disk again every second, so the figure is about
// half of that plus the resumed write. It prints
// `BENCH mailbox.disk_full_recover_s <v> s`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/internal/diskfree"
	"github.com/prism-mesh/prism/mailbox/runner"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

const (
	mib     = 1 << 20
	topic   = "disk.events"
	mailbox = "disk@bench"
)

func main() {
	runs := flag.Int("runs", 5, "rounds of fill, hold and recover")
	perRun := flag.Int("events", 1000, "events produced while the disk is full, each round")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "# diskbench: mounting a small filesystem needs root; mailbox.disk_full_recover_s not measured")
		return
	}
	if err := run(*runs, *perRun); err != nil {
		fmt.Fprintln(os.Stderr, "diskbench:", err)
		os.Exit(1)
	}
}

func run(runs, perRun int) error {
	base, err := os.MkdirTemp("", "diskbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", base).CombinedOutput(); err != nil {
		return fmt.Errorf("mount a tmpfs: %v: %s", err, out)
	}
	defer func() { _ = exec.Command("umount", base).Run() }()

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic, topic+".dlq"))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	r, err := runner.New(runner.Config{DataDir: filepath.Join(base, "data"), Brokers: cluster.ListenAddrs(),
		MinFree: diskfree.Watermark{MinBytes: 16 * mib}, Logger: quiet})
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Open(runner.MailboxConfig{ID: mailbox, Topics: []string{topic}}); err != nil {
		return err
	}
	stored := func() int64 {
		st, err := r.Stats(context.Background(), mailbox)
		if err != nil {
			return -1
		}
		return st.TotalEvents
	}
	want := int64(0)
	produce := func(round string, n int) error {
		recs := make([]*kgo.Record, n)
		for i := range recs {
			b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprintf("%s-%05d", round, i), Topic: topic, PublishedAt: timestamppb.Now()}})
			recs[i] = &kgo.Record{Topic: topic, Value: b}
		}
		want += int64(n)
		return cl.ProduceSync(context.Background(), recs...).FirstErr()
	}
	if err := produce("warm", perRun); err != nil {
		return err
	}
	if err := await("the first load stored", func() bool { return stored() == want }); err != nil {
		return err
	}

	var took []time.Duration
	for round := range runs {
		ballast, err := fill(base, 8*mib)
		if err != nil {
			return err
		}
		if err := await("disk pressure", func() bool { return r.DiskPressure() != nil }); err != nil {
			return err
		}
		held := stored()
		if err := produce(fmt.Sprint("round", round), perRun); err != nil {
			return err
		}
		// Long enough for every claim to fetch and hold a batch, and a random
		// part of the held ingest's 1s look-again interval, so the rounds
		// sample where in it space returns rather than one fixed phase.
		time.Sleep(2*time.Second + rand.N(time.Second))
		if n := stored(); n != held {
			return fmt.Errorf("round %d: %d events stored while the disk was short", round, n-held)
		}
		if err := os.Remove(ballast); err != nil {
			return err
		}
		freed := time.Now()
		if err := await("ingest resumed", func() bool { return stored() > held }); err != nil {
			return err
		}
		took = append(took, time.Since(freed))
		if err := await("every held event stored", func() bool { return stored() == want }); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "# round %d: ingest resumed %v after the ballast went, %d held events stored in %v\n",
			round, took[round].Round(time.Millisecond), perRun, time.Since(freed).Round(time.Millisecond))
	}
	slices.Sort(took)
	fmt.Printf("BENCH mailbox.disk_full_recover_s %.3f s\n", took[len(took)/2].Seconds())
	return nil
}

// fill writes a ballast file in dir until leave bytes are free on its filesystem.
func fill(dir string, leave uint64) (string, error) {
	u, err := diskfree.Statfs(dir)
	if err != nil {
		return "", err
	}
	if u.Free <= leave {
		return "", fmt.Errorf("only %d bytes free before the ballast", u.Free)
	}
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	chunk := make([]byte, 64<<10)
	for n := int64(u.Free - leave); n > 0; n -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(n, int64(len(chunk)))]); err != nil {
			f.Close()
			return "", fmt.Errorf("write ballast: %w", err)
		}
	}
	return path, f.Close()
}

func await(what string, cond func() bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for " + what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
