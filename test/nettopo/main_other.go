//go:build !linux

// Command nettopo builds the networking e2e topology; it needs Linux network namespaces.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "nettopo: network namespaces need Linux")
	os.Exit(1)
}
