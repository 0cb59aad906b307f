package kafkasec

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// KgoOpts are the franz-go client options that connect as s says, for the
// clients written with franz-go (the admin's audit publisher): the same
// rules as Apply, so one set of --kafka-* flags means one thing for every
// client. Like Apply, it reads the certificate files now.
func (s Security) KgoOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.TLS != nil {
		tc, err := s.TLS.config()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if err := s.plainOverTLS(); err != nil {
		return nil, err
	}
	if s.SASL != nil {
		m, err := s.SASL.mechanism()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func (s *SASL) mechanism() (sasl.Mechanism, error) {
	if s.User == "" || s.Password == "" {
		return nil, fmt.Errorf("kafka sasl %s: user and password are required", s.Mechanism)
	}
	switch s.Mechanism {
	case SASLPlain:
		return plain.Auth{User: s.User, Pass: s.Password}.AsMechanism(), nil
	case SASLScramSHA256:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism(), nil
	case SASLScramSHA512:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka sasl mechanism %q: want %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
}
