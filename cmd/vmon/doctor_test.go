package main

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// The doctor's pin is a copy of the version runsc/go.mod builds; a bump of one without the other
// would have the doctor flag every correctly installed runsc.
func TestRunscPinMatchesTheBuild(t *testing.T) {
	data, err := os.ReadFile("../../runsc/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("runsc/go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Require {
		if r.Mod.Path == "gvisor.dev/gvisor" {
			if !strings.HasSuffix(r.Mod.Version, "-"+runscPin) {
				t.Fatalf("runsc/go.mod builds gVisor %s, the doctor expects %s", r.Mod.Version, runscPin)
			}
			return
		}
	}
	t.Fatal("runsc/go.mod does not require gvisor.dev/gvisor")
}
