package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// ParsePrivateKey reads the private key of a PEM file in every encoding the
// tools that write our keys use (docs/security.md#key-files): cert-manager
// and its csi-driver write PKCS#1 ("RSA PRIVATE KEY") for RSA and SEC1 ("EC
// PRIVATE KEY") for ECDSA unless told PKCS#8, openssl genrsa and ecparam
// write those too, and Go, openssl genpkey and `prism certs` write PKCS#8
// ("PRIVATE KEY") for RSA, ECDSA and Ed25519. Blocks that are no key
// (openssl ecparam's "EC PARAMETERS") are skipped; the first key block is
// the key. Any other encoding, an encrypted key among them, is refused with
// an error naming what was found, since a component cannot ask for a
// passphrase.
func ParsePrivateKey(b []byte) (crypto.Signer, error) {
	var seen []string
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		seen = append(seen, block.Type)
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		if _, encrypted := block.Headers["DEK-Info"]; encrypted {
			return nil, fmt.Errorf("private key: %q block is encrypted (Proc-Type %s): write it unencrypted (openssl pkey -in KEY -out KEY)", block.Type, block.Headers["Proc-Type"])
		}
		return parseKeyBlock(block)
	}
	if len(seen) == 0 {
		return nil, errors.New("private key: no PEM block found")
	}
	return nil, fmt.Errorf("private key: no PEM private key block found (have %s)", strings.Join(seen, ", "))
}

func parseKeyBlock(block *pem.Block) (crypto.Signer, error) {
	var (
		key any
		err error
		enc string
	)
	switch block.Type {
	case "PRIVATE KEY":
		enc = "PKCS#8"
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		enc = "PKCS#1"
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		enc = "SEC1"
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New(`private key: "ENCRYPTED PRIVATE KEY" (encrypted PKCS#8) is not supported: write it unencrypted (openssl pkey -in KEY -out KEY)`)
	default:
		return nil, fmt.Errorf("private key: %q is not a supported encoding: want PKCS#8 (PRIVATE KEY), PKCS#1 (RSA PRIVATE KEY) or SEC1 (EC PRIVATE KEY)", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("private key: %s (%q): %w", enc, block.Type, err)
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return k, nil
	case *ecdsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("private key: %s (%q) holds a %T, which cannot sign a TLS handshake: want RSA, ECDSA or Ed25519", enc, block.Type, key)
	}
}

// pkcs8PEM re-encodes key as the PKCS#8 PEM go-spiffe's x509svid.Parse
// reads, so its checks of the leaf and of the key matching it apply to a key
// of any encoding ParsePrivateKey reads.
func pkcs8PEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
