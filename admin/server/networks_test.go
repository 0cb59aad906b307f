package server

import (
	"net/netip"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestAdmitAddress(t *testing.T) {
	t.Parallel()
	s := &Server{cfg: Config{RunnerNetworks: DefaultRunnerNetworks}}
	cases := []struct {
		addr string
		code codes.Code
	}{
		{"127.0.0.1:9090", codes.OK},
		{"[::1]:9090", codes.OK},
		{"10.4.2.7:9090", codes.OK},
		{"172.31.255.1:9090", codes.OK},
		{"192.168.1.10:9090", codes.OK},
		{"100.64.0.9:9090", codes.OK},
		{"[fd00::7]:9090", codes.OK},
		{"[::ffff:10.1.2.3]:9090", codes.OK},
		{"8.8.8.8:53", codes.PermissionDenied},
		{"172.32.0.1:9090", codes.PermissionDenied},
		{"[2001:db8::1]:9090", codes.PermissionDenied},
		{"[::ffff:8.8.8.8]:53", codes.PermissionDenied},
		{"runner.example.com:9090", codes.PermissionDenied},
		{"localhost:9090", codes.PermissionDenied},
		{"10.0.0.1", codes.InvalidArgument},
	}
	for _, tc := range cases {
		if got := status.Code(s.admitAddress("runner_address", tc.addr)); got != tc.code {
			t.Errorf("%s: %v, want %v", tc.addr, got, tc.code)
		}
	}
	if err := (&Server{}).admitAddress("runner_address", "8.8.8.8:53"); err != nil {
		t.Errorf("no networks must allow any address: %v", err)
	}
	if _, err := ParseNetworks("10.0.0.0/8, fc00::/7"); err != nil {
		t.Fatal(err)
	}
	if got, _ := ParseNetworks("10.1.2.3/8"); len(got) != 1 || got[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("ParseNetworks keeps the host bits: %v", got)
	}
}
