package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
)

// devIdentities are the certificates prism dev issues from its throwaway
// CA: one per component, as a deployment has.
type devIdentities struct {
	admin, proxy, gateway, operator pki.Files
	// ctlConfig is the prismctl config file prism dev wrote, or "".
	ctlConfig string
}

const (
	devGatewayID  = "prism-dev-gateway"
	devOperatorID = "dev"
	devWrittenBy  = "prism dev"
)

// preparePKI keeps a CA in <data>/pki (reused with a kept --data-dir, so
// prismctl's files stay valid) and issues every component's certificate,
// then points prismctl at the operator's.
func (e *devEnv) preparePKI(context.Context) error {
	if e.f.insecure {
		e.log.Warn("prism dev runs without TLS (--insecure): every port is plaintext and unauthenticated")
		return nil
	}
	dir := filepath.Join(e.dataDir, "pki")
	ca, err := loadCA(dir)
	if err != nil {
		if ca, err = initCA(dir, identity.DefaultTrustDomain, 365*24*time.Hour); err != nil {
			return fmt.Errorf("dev CA in %s: %w", dir, err)
		}
	}
	issue := func(role identity.Role, name string) (pki.Files, error) {
		return ca.IssueFiles(dir, pki.Request{Role: role, Name: name, Hosts: []string{"127.0.0.1", "::1", "localhost"}, Validity: 30 * 24 * time.Hour})
	}
	ids := &devIdentities{}
	for _, c := range []struct {
		into *pki.Files
		role identity.Role
		name string
	}{
		{&ids.admin, identity.Admin, devAdminID}, {&ids.proxy, identity.Proxy, devProxyID},
		{&ids.gateway, identity.Gateway, devGatewayID}, {&ids.operator, identity.Operator, devOperatorID},
	} {
		if *c.into, err = issue(c.role, c.name); err != nil {
			return err
		}
	}
	e.ids = ids
	e.writeCtlConfig()
	return nil
}

// writeCtlConfig leaves prismctl a config file with the operator identity,
// as kind leaves a kubeconfig context, unless the user keeps one of their
// own there; one of prism dev's own it replaces, and removes on exit when
// the data dir goes with it.
func (e *devEnv) writeCtlConfig() {
	path := client.ConfigPath()
	if path == "" {
		return
	}
	old, exists, err := client.ReadConfig(path)
	if err != nil || (exists && old.WrittenBy != devWrittenBy) {
		e.log.Info("leaving the existing prismctl config alone", "path", path, "err", err)
		return
	}
	op := e.ids.operator
	cfg := client.FileConfig{Admin: e.f.adminAddr, CACert: op.CA, Cert: op.Cert, Key: op.Key, KafkaBrokers: strings.Join(e.brokers, ","), WrittenBy: devWrittenBy}
	if err := client.WriteConfig(path, cfg); err != nil {
		e.log.Warn("cannot write the prismctl config", "path", path, "err", err)
		return
	}
	e.ids.ctlConfig = path
	if e.f.dataDir == "" {
		e.onStop("prismctl config", func() error {
			if c, ok, err := client.ReadConfig(path); err == nil && ok && c == cfg {
				return os.Remove(path)
			}
			return nil
		})
	}
}

// source loads one of the dev identities; nil with --insecure.
func (e *devEnv) source(f pki.Files) (*pki.Source, error) {
	if e.ids == nil {
		return nil, nil
	}
	src, err := pki.Load(f, e.log)
	if err != nil {
		return nil, errors.Join(errors.New("dev identity"), err)
	}
	return src, nil
}

func (ids *devIdentities) proxyFiles() pki.Files {
	if ids == nil {
		return pki.Files{}
	}
	return ids.proxy
}

func (ids *devIdentities) gatewayFiles() pki.Files {
	if ids == nil {
		return pki.Files{}
	}
	return ids.gateway
}

// printIdentity says where the certificates are and how prismctl finds its
// own.
func (e *devEnv) printIdentity(out io.Writer) {
	if e.ids == nil {
		fmt.Fprintf(out, "  tls       off (--insecure): every port is plaintext and unauthenticated\n")
		return
	}
	fmt.Fprintf(out, "  tls       mutual TLS everywhere; throwaway CA and certificates in %s\n", filepath.Dir(e.ids.operator.CA))
	if e.ids.ctlConfig != "" {
		fmt.Fprintf(out, "            prismctl finds its operator identity in %s\n", e.ids.ctlConfig)
	}
}

// ctlFlags are the prismctl flags the printed commands need: none when the
// config file holds them.
func (e *devEnv) ctlFlags() string {
	switch {
	case e.ids == nil:
		return "--insecure --admin " + e.f.adminAddr + " "
	case e.ids.ctlConfig != "":
		return ""
	}
	op := e.ids.operator
	return fmt.Sprintf("--admin %s --cacert %s --cert %s --key %s ", e.f.adminAddr, op.CA, op.Cert, op.Key)
}
