package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/internal/diskfree"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// metric is the value of the gauge or counter name whose label is value,
// summed over the series that match, or -1 when none does.
func metric(t *testing.T, r *Runner, name, label, value string) float64 {
	t.Helper()
	mfs, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					found = true
					sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	if !found {
		return -1
	}
	return sum
}

// readyz is /readyz's status and body.
func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A runner whose data dir is below its watermark is not ready, says why, and
// exports the pressure, whatever its mailboxes do.
func TestDiskPressureNotReady(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Only a filesystem more than 99.99 % free would have room.
	r, err := New(Config{DataDir: dir, Brokers: []string{"127.0.0.1:1"}, MinFree: diskfree.Watermark{MinPercent: 99.99}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	_, httpAddr := serve(t, r)
	base := "http://" + httpAddr
	code, body := readyz(t, base)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "ingest paused: runner data dir "+dir) ||
		!strings.Contains(body, "below --min-free-percent 99.99%") {
		t.Fatalf("/readyz = %d %q, want 503 naming the dir and the watermark", code, body)
	}
	if got := metric(t, r, "prism_mailbox_disk_pressure", "dir", dir); got != 1 {
		t.Fatalf("prism_mailbox_disk_pressure{dir=%s} = %v, want 1", dir, got)
	}
	if got := metric(t, r, "prism_mailbox_disk_free_bytes", "dir", dir); got <= 0 {
		t.Fatalf("prism_mailbox_disk_free_bytes{dir=%s} = %v", dir, got)
	}
	if _, err := New(Config{DataDir: dir, Brokers: []string{"x"}, MinFree: diskfree.Watermark{MinPercent: 100}}); err == nil {
		t.Fatal("a 100 % watermark was accepted")
	}
}

// smallFS mounts a tmpfs of size bytes for the test, or skips it where the
// test cannot mount one (not root, no tmpfs).
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs at %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a ballast file on dir's filesystem until leave bytes are free.
func fill(t *testing.T, dir string, leave uint64) string {
	t.Helper()
	u, err := diskfree.Statfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Free <= leave {
		t.Fatalf("only %d bytes free before the ballast, want more than %d", u.Free, leave)
	}
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for n := int64(u.Free - leave); n > 0; n -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(n, int64(len(chunk)))]); err != nil {
			t.Fatalf("write ballast: %v", err)
		}
	}
	return path
}

func events(prefix string, n int) []*envelopev1.PrismEnvelope {
	out := make([]*envelopev1.PrismEnvelope, n)
	for i := range out {
		out[i] = &envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprintf("%s-%04d", prefix, i), Topic: "disk.events", PublishedAt: timestamppb.Now()}}
	}
	return out
}

// TestDiskFullPausesAndRecovers fills a real small filesystem under a
// runner's store: ingest pauses before writing (nothing committed past the
// held batches), /readyz says why, and once the ballast goes ingest resumes by
// itself and stores every event exactly once.
func TestDiskFullPausesAndRecovers(t *testing.T) {
	t.Parallel()
	const (
		mib     = 1 << 20
		topic   = "disk.events"
		mailbox = "disk@p1"
		before  = 200 // stored before the disk fills
		during  = 300 // produced while it is full
	)
	small := smallFS(t, 64*mib)
	data := filepath.Join(small, "data")
	k := kafkatest.Start(t, kafkatest.Topics(3, topic, topic+".dlq"))
	r, err := New(Config{DataDir: data, Brokers: k.Brokers, BatchSize: 50, BatchWait: 10 * time.Millisecond,
		MinFree: diskfree.Watermark{MinBytes: 16 * mib}, DiskCheckInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	_, httpAddr := serve(t, r)
	base := "http://" + httpAddr
	if err := r.Open(MailboxConfig{ID: mailbox, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	stored := func() int64 {
		st, err := r.Stats(context.Background(), mailbox)
		if err != nil {
			t.Fatal(err)
		}
		return st.TotalEvents
	}
	k.ProduceEnvelopes(t, topic, events("before", before)...)
	waitFor(t, "the first events stored and committed", func() bool {
		return stored() == before && k.Committed(t, mailbox, topic) == before
	})
	waitFor(t, "ready", func() bool { code, _ := readyz(t, base); return code == http.StatusOK })

	// Leave 8 MiB: below the 16 MiB watermark, and room for what Badger
	// writes meanwhile (a memory-mapped file past a full tmpfs is a SIGBUS).
	ballast := fill(t, small, 8*mib)
	waitFor(t, "not ready for want of space", func() bool {
		code, body := readyz(t, base)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "runner data dir "+data) &&
			strings.Contains(body, "below --min-free-bytes")
	})
	if got := metric(t, r, "prism_mailbox_disk_pressure", "dir", data); got != 1 {
		t.Fatalf("prism_mailbox_disk_pressure = %v, want 1", got)
	}
	k.ProduceEnvelopes(t, topic, events("during", during)...)
	waitFor(t, "ingest paused", func() bool { return metric(t, r, "prism_mailbox_ingest_paused", "mailbox", mailbox) >= 1 })
	// Held, not failing: a few more looks at the disk change nothing.
	time.Sleep(200 * time.Millisecond)
	if n, c := stored(), k.Committed(t, mailbox, topic); n != before || c != before {
		t.Fatalf("while the disk is short: %d stored, offsets committed to %d; want %d and %d", n, c, before, before)
	}
	if got := metric(t, r, "prism_mailbox_ingest_stalls_total", "mailbox", mailbox); got > 0 {
		t.Fatalf("%v stalls counted for a full disk", got)
	}

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitFor(t, "every event stored", func() bool { return stored() == before+during })
	t.Logf("disk_full_recover_s %.3f (ballast removed → every held event stored)", time.Since(freed).Seconds())
	waitFor(t, "ready again", func() bool { code, _ := readyz(t, base); return code == http.StatusOK })
	waitFor(t, "offsets committed past every event", func() bool { return k.Committed(t, mailbox, topic) == before+during })
	if got := metric(t, r, "prism_mailbox_ingest_paused", "mailbox", mailbox); got != 0 {
		t.Fatalf("prism_mailbox_ingest_paused = %v after recovery", got)
	}
	if got := metric(t, r, "prism_mailbox_disk_pressure", "dir", data); got != 0 {
		t.Fatalf("prism_mailbox_disk_pressure = %v after recovery", got)
	}
	// Exactly once: the count is exact and every id is there.
	src, _, _ := r.Mailbox(mailbox)
	for _, e := range append(events("before", before), events("during", during)...) {
		if _, err := src.Get(context.Background(), e.GetMetadata().GetMessageId()); err != nil {
			t.Fatalf("event %s: %v", e.GetMetadata().GetMessageId(), err)
		}
	}
	if n := stored(); n != before+during {
		t.Fatalf("%d stored, want %d", n, before+during)
	}
	if err := r.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
