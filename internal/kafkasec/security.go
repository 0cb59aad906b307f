// Package kafkasec is how Prism's Kafka clients reach the brokers: TLS,
// SASL, both or neither (Security), and the --kafka-tls* and --kafka-sasl*
// flags that describe it (Flags). prism runner's ingest, prism admin's audit
// publisher and prismctl's topic check share both, so one set of flags means
// one thing everywhere.
package kafkasec

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// SASL mechanisms, by their Kafka names.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Security is how a client reaches Kafka; Apply sets it on the client's
// sarama config (ingest's consumer group, dead-letter producer and topic
// requests share one). The zero value is plaintext without authentication.
type Security struct {
	TLS  *TLS  // nil = plaintext
	SASL *SASL // nil = no authentication
}

// TLS to the brokers.
type TLS struct {
	CAFile string // PEM bundle the brokers' certificates chain to; "" = the system roots
	// CertFile and KeyFile are a client certificate for brokers that require
	// one (ssl.client.auth=required). They are read on each handshake, so a
	// rotated pair is used by the next connection without a restart.
	CertFile, KeyFile string
	ServerName        string // name the brokers' certificates must carry; "" = each broker's host
	// InsecureSkipVerify accepts any broker certificate: the connection is
	// encrypted but the broker unauthenticated, so a SASL password may go to
	// whoever answers. For throwaway test brokers only.
	InsecureSkipVerify bool
}

// SASL authentication to the brokers.
type SASL struct {
	Mechanism string // SASLPlain, SASLScramSHA256 or SASLScramSHA512
	User      string
	Password  string
}

// Apply makes c connect as s says. It reads the CA and client certificate
// files now, so a missing or unreadable file fails the start, not the first
// connection.
func (s Security) Apply(c *sarama.Config) error {
	if s.TLS != nil {
		tc, err := s.TLS.config()
		if err != nil {
			return err
		}
		c.Net.TLS.Enable, c.Net.TLS.Config = true, tc
	}
	if s.SASL != nil {
		if err := s.SASL.apply(c); err != nil {
			return err
		}
	}
	return s.plainOverTLS()
}

// plainOverTLS refuses SASL PLAIN without TLS: PLAIN sends the password as
// it is.
func (s Security) plainOverTLS() error {
	if s.SASL != nil && s.SASL.Mechanism == SASLPlain && s.TLS == nil {
		return errors.New("kafka sasl PLAIN sends the password in clear: enable TLS, or use SCRAM-SHA-256/512")
	}
	return nil
}

// Describe says how c reaches the brokers, for logs and errors; never the
// password.
func Describe(c *sarama.Config) string {
	var parts []string
	switch {
	case !c.Net.TLS.Enable:
		parts = append(parts, "plaintext")
	case c.Net.TLS.Config != nil && c.Net.TLS.Config.InsecureSkipVerify:
		parts = append(parts, "tls without broker verification")
	default:
		parts = append(parts, "tls")
	}
	if c.Net.SASL.Enable {
		parts = append(parts, "sasl "+string(c.Net.SASL.Mechanism)+" as "+strconv.Quote(c.Net.SASL.User))
	} else {
		parts = append(parts, "unauthenticated")
	}
	return strings.Join(parts, ", ")
}

// ClosedHint explains a connection the broker closed without an answer,
// which is how brokers meet credentials or a mechanism they refuse, and a
// plaintext client on a TLS listener; "" for any other error.
func ClosedHint(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return " (the broker closed the connection: check the SASL mechanism, user and password, and whether its listener expects TLS)"
	}
	return ""
}

func (t *TLS) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		b, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka tls ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("kafka tls ca %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("kafka tls: a client certificate needs both its cert and key files")
	}
	if t.CertFile != "" {
		certFile, keyFile := t.CertFile, t.KeyFile
		load := func() (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka tls client certificate %s: %w", certFile, err)
			}
			return &c, nil
		}
		if _, err := load(); err != nil {
			return nil, err
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
	}
	return tc, nil
}

func (s *SASL) apply(c *sarama.Config) error {
	if _, err := s.mechanism(); err != nil {
		return err
	}
	c.Net.SASL.Enable, c.Net.SASL.Handshake = true, true
	c.Net.SASL.User, c.Net.SASL.Password = s.User, s.Password
	switch s.Mechanism {
	case SASLPlain:
		c.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case SASLScramSHA256:
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha256.New)} }
	case SASLScramSHA512:
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha512.New)} }
	}
	return nil
}

// scramClient is sarama's SCRAM conversation over xdg-go/scram, the
// implementation sarama documents: one per authentication.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }
