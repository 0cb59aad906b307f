package kafkasec

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// EnvSASLPassword holds the SASL password for containers that take it from
// a secret as an environment variable; a flag would show it in ps.
const EnvSASLPassword = "PRISM_KAFKA_SASL_PASSWORD"

// Flags are the command-line view of Security: --kafka-tls*,
// --kafka-sasl*, and the password's file or EnvSASLPassword.
type Flags struct {
	tls                bool
	ca, cert, key      string
	serverName         string
	insecureSkipVerify bool
	mechanism          string
	user               string
	passwordFile       string
}

// Register adds the flags to fs.
func (k *Flags) Register(fs *pflag.FlagSet) {
	fs.BoolVar(&k.tls, "kafka-tls", false, "connect to Kafka over TLS (implied by the other --kafka-tls-* flags)")
	fs.StringVar(&k.ca, "kafka-tls-ca", "", "PEM bundle the brokers' certificates chain to (default: the system roots)")
	fs.StringVar(&k.cert, "kafka-tls-cert", "", "PEM client certificate for brokers that require one (ssl.client.auth=required); re-read on each new connection")
	fs.StringVar(&k.key, "kafka-tls-key", "", "PEM private key of --kafka-tls-cert")
	fs.StringVar(&k.serverName, "kafka-tls-server-name", "", "name the brokers' certificates must carry (default: each broker's host)")
	fs.BoolVar(&k.insecureSkipVerify, "kafka-tls-insecure-skip-verify", false, "accept any broker certificate: encrypted but unauthenticated, the SASL password goes to whoever answers (test brokers only)")
	fs.StringVar(&k.mechanism, "kafka-sasl-mechanism", "", "SASL mechanism: "+SASLScramSHA256+", "+SASLScramSHA512+" or "+SASLPlain+" (PLAIN only with TLS); empty: no SASL")
	fs.StringVar(&k.user, "kafka-sasl-user", "", "SASL user")
	fs.StringVar(&k.passwordFile, "kafka-sasl-password-file", "", "file holding the SASL password (or env "+EnvSASLPassword+")")
}

// Security is the connection the flags describe, reading the SASL password
// from its file or the environment.
func (k *Flags) Security() (Security, error) {
	var sec Security
	if k.tls || k.ca != "" || k.cert != "" || k.key != "" || k.serverName != "" || k.insecureSkipVerify {
		sec.TLS = &TLS{CAFile: k.ca, CertFile: k.cert, KeyFile: k.key, ServerName: k.serverName, InsecureSkipVerify: k.insecureSkipVerify}
	}
	envPassword := os.Getenv(EnvSASLPassword)
	if k.mechanism == "" {
		if k.user != "" || k.passwordFile != "" || envPassword != "" {
			return sec, errors.New("--kafka-sasl-user, --kafka-sasl-password-file and " + EnvSASLPassword + " need --kafka-sasl-mechanism")
		}
		return sec, nil
	}
	password := envPassword
	switch {
	case k.passwordFile != "" && envPassword != "":
		return sec, errors.New("--kafka-sasl-password-file and " + EnvSASLPassword + " exclude each other")
	case k.passwordFile != "":
		b, err := os.ReadFile(k.passwordFile)
		if err != nil {
			return sec, fmt.Errorf("--kafka-sasl-password-file: %w", err)
		}
		// Secrets written by editors and `echo` end in a newline that is no part of the password.
		password = strings.TrimRight(string(b), "\r\n")
	}
	if k.user == "" || password == "" {
		return sec, errors.New("--kafka-sasl-mechanism needs --kafka-sasl-user and a password (--kafka-sasl-password-file or " + EnvSASLPassword + ")")
	}
	sec.SASL = &SASL{Mechanism: strings.ToUpper(k.mechanism), User: k.user, Password: password}
	return sec, nil
}
