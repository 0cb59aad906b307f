package server

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultRunnerNetworks are where runners live in the deployments we know:
// loopback (prism dev), the private and shared ranges pod networks use, and
// IPv6 unique-local and link-local. A route never points anywhere else
// unless the operator says so (prism admin --runner-networks).
var DefaultRunnerNetworks = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("fe80::/10"),
}

// ParseNetworks reads a comma-separated list of CIDR prefixes.
func ParseNetworks(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("network %q: %w", f, err)
		}
		out = append(out, p.Masked())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no networks in %q", s)
	}
	return out, nil
}

// admitAddress refuses a runner address routes could point at that is not
// an IP address in the allowed networks (a caller may only name its own
// runner, and its runner only lives there). No networks allows any address.
func (s *Server) admitAddress(field, addr string) error {
	if len(s.cfg.RunnerNetworks) == 0 || addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%s %q: %v", field, addr, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "%s %q: a runner address must be an IP address in the allowed networks (prism admin --runner-networks), not a name", field, addr)
	}
	ip = ip.Unmap()
	for _, p := range s.cfg.RunnerNetworks {
		if p.Contains(ip) {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "%s %q: outside the allowed runner networks %v (prism admin --runner-networks)", field, addr, s.cfg.RunnerNetworks)
}
