package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
)

// devEnv is what `prism dev` has started. Each component is one step that
// registers how to stop it; later components (admin, sidecar, gateway) are
// more steps, stopped in reverse order.
type devEnv struct {
	log     *slog.Logger
	brokers []string
	runner  *runner.Runner
	httpURL string
	stops   []func() error
}

func (e *devEnv) onStop(fn func() error) { e.stops = append(e.stops, fn) }

func (e *devEnv) stop() error {
	var errs []error
	for i := len(e.stops) - 1; i >= 0; i-- {
		errs = append(errs, e.stops[i]())
	}
	return errors.Join(errs...)
}

type devFlags struct {
	runner    runnerFlags
	kafkaPort int
	rate      float64
	demo      bool
}

func devCommand() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the mesh on one machine with embedded defaults and demo traffic",
		Long: `dev starts an embedded Kafka broker (franz-go's kfake, the real Kafka protocol, on loopback)
unless --kafka is given, a runner for mailbox demo@proxy-01 and a producer of demo envelopes,
then prints a curl line that queries the mailbox.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := f.runner.logger()
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer cancel()
			e := &devEnv{log: log}
			err = e.run(ctx, &f, cmd)
			if stopErr := e.stop(); stopErr != nil {
				log.Error("stopping dev environment", "err", stopErr)
			}
			return err
		},
	}
	f.runner.register(cmd, runnerFlags{
		mailbox: "demo@proxy-01", topics: []string{"audit.events", "admin.events"},
		grpcAddr: "127.0.0.1:9090", httpAddr: "127.0.0.1:8080", logFormat: "text",
	})
	cmd.Flags().IntVar(&f.kafkaPort, "kafka-port", 0, "loopback port of the embedded broker (0: any free port)")
	cmd.Flags().Float64Var(&f.rate, "rate", 20, "demo envelopes per second")
	cmd.Flags().BoolVar(&f.demo, "demo", true, "produce demo envelopes")
	return cmd
}

func (e *devEnv) run(ctx context.Context, f *devFlags, cmd *cobra.Command) error {
	if err := e.startKafka(f); err != nil {
		return err
	}
	if err := e.startRunner(f); err != nil {
		return err
	}
	if f.demo {
		if err := e.startDemo(f); err != nil {
			return err
		}
	}
	e.awaitEvents(ctx, f)
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "\nprism dev: Kafka at %v, mailbox %s, data in %s\n", e.brokers, f.runner.mailbox, f.runner.dataDir)
	fmt.Fprintf(out, "query the mailbox (newest first):\n  curl -s '%s/v1/mailboxes/%s/events?limit=5'\n", e.httpURL, f.runner.mailbox)
	fmt.Fprintf(out, "  curl -s '%s/v1/mailboxes/%s/stats'\n", e.httpURL, f.runner.mailbox)
	fmt.Fprintf(out, "gRPC: prism.mailbox.v1.MailboxQuery at %s with metadata x-mailbox-id: %s\nCtrl-C stops.\n", f.runner.grpcAddr, f.runner.mailbox)
	<-ctx.Done()
	return nil
}

// startKafka uses --kafka if given, or starts an embedded broker on loopback
// with the topics and their dead-letter topics created.
func (e *devEnv) startKafka(f *devFlags) error {
	if f.runner.kafka != "" {
		e.brokers = splitBrokers(f.runner.kafka)
		return nil
	}
	topics := append([]string(nil), f.runner.topics...)
	for _, t := range f.runner.topics {
		topics = append(topics, t+ingest.DLQSuffix)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(f.kafkaPort), kfake.SeedTopics(3, topics...))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	e.onStop(func() error { c.Close(); return nil })
	e.brokers = c.ListenAddrs()
	e.log.Info("embedded kafka started", "addrs", e.brokers, "topics", topics)
	return nil
}

func (e *devEnv) startRunner(f *devFlags) error {
	if f.runner.dataDir == "" {
		dir, err := os.MkdirTemp("", "prism-dev-")
		if err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		f.runner.dataDir = dir
		e.onStop(func() error { return os.RemoveAll(dir) })
	}
	r, httpAddr, err := f.runner.start(e.log, e.brokers)
	if err != nil {
		return err
	}
	e.onStop(r.Close)
	e.runner, e.httpURL = r, "http://"+httpAddr
	return nil
}

// startDemo produces demo envelopes round-robin over the topics at --rate.
func (e *devEnv) startDemo(f *devFlags) error {
	if f.rate <= 0 {
		return fmt.Errorf("--rate must be positive")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return fmt.Errorf("demo producer: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.onStop(func() error { cancel(); <-done; cl.Close(); return nil })
	gen := demo.New(demo.Options{Seed: uint64(time.Now().UnixNano()), Namespace: "demo", IDPrefix: fmt.Sprintf("demo-%x", time.Now().Unix())})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(float64(time.Second) / f.rate))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			topic := f.runner.topics[i%len(f.runner.topics)]
			id, b := gen.NextBytes(topic)
			cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(id), Value: b}, func(_ *kgo.Record, err error) {
				if err != nil && ctx.Err() == nil {
					e.log.Warn("demo produce failed", "err", err)
				}
			})
		}
	}()
	e.log.Info("demo producer started", "rate", f.rate, "topics", f.runner.topics)
	return nil
}

// awaitEvents waits (bounded) until the mailbox holds events, so the printed
// curl line returns some.
func (e *devEnv) awaitEvents(ctx context.Context, f *devFlags) {
	if !f.demo {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if st, err := e.runner.Stats(ctx, f.runner.mailbox); err == nil && st.GetTotalEvents() > 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
