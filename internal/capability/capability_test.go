package capability

import (
	"os"
	"testing"
)

func TestEffective(t *testing.T) {
	caps, err := Effective()
	if err != nil {
		t.Fatal(err)
	}
	// Root (CI and the node) holds the administrative capabilities; others must not report them.
	if root := os.Geteuid() == 0; Has(NetAdmin) != root || Has(SysAdmin) != root || (caps != 0) != root {
		t.Fatalf("euid %d: caps %#x, NetAdmin %v, SysAdmin %v", os.Geteuid(), caps, Has(NetAdmin), Has(SysAdmin))
	}
}
