package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// EnvConfig names prismctl's config file instead of DefaultConfigPath.
const EnvConfig = "PRISMCTL_CONFIG"

// FileConfig is prismctl's config file: which admin nodes to call and the
// files of the identity to call them with. `prism dev` writes one for its
// throwaway CA, the way kind writes a kubeconfig context.
type FileConfig struct {
	Admin  string `json:"admin,omitempty"`
	CACert string `json:"cacert,omitempty"`
	Cert   string `json:"cert,omitempty"`
	Key    string `json:"key,omitempty"`
	// KafkaBrokers, host:port,..., are where prismctl namespace create
	// looks a namespace's topics up.
	KafkaBrokers string `json:"kafkaBrokers,omitempty"`
	// WrittenBy is "prism dev" in a file prism dev may replace and remove.
	WrittenBy string `json:"writtenBy,omitempty"`
}

// ConfigPath is $PRISMCTL_CONFIG, else prismctl.yaml in the user's config
// directory (~/.config/prism/prismctl.yaml on Linux); "" when there is none.
func ConfigPath() string {
	if p := os.Getenv(EnvConfig); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "prism", "prismctl.yaml")
}

// ReadConfig reads path; ok is false when there is no such file.
func ReadConfig(path string) (c FileConfig, ok bool, err error) {
	if path == "" {
		return c, false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, false, nil
	}
	if err != nil {
		return c, false, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, false, fmt.Errorf("config %s: %w", path, err)
	}
	return c, true, nil
}

// WriteConfig writes c to path (0600, its directory made 0700).
func WriteConfig(path string, c FileConfig) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
