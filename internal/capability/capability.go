// Package capability reads this process's effective Linux capabilities, which decide what a node
// may do (network sandboxes, mount overlays). It only reads /proc; it never changes anything.
package capability

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Linux capability bit numbers (linux/capability.h).
const (
	NetAdmin  = 12
	SysChroot = 18
	SysAdmin  = 21
)

// Effective returns the effective capability set from /proc/self/status.
func Effective() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("CapEff not found in /proc/self/status")
}

// Has reports whether the process holds capability bit; unreadable state counts as no.
func Has(bit uint) bool {
	caps, err := Effective()
	return err == nil && caps&(1<<bit) != 0
}
