package codeinterp

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/base64"
	"fmt"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

//go:embed JavaRunner.java
var javaRunner []byte

// Java runs Java cells through JShell in one JVM per context (JavaRunner.java, started by the
// JDK's source launcher, so nothing is compiled at build time): declarations carry over from
// cell to cell, and the last expression is the cell's value. E2B's template runs IJava, a JShell
// kernel too; Debian packages none, but its JDK has jshell.
func Java(java string) Language {
	env := func(save bool, env map[string]string) string {
		var b bytes.Buffer
		b.WriteString("//vmon-env\n")
		if save {
			b.WriteString("save\n")
		}
		for _, k := range sortedKeys(env) {
			fmt.Fprintf(&b, "set %s %s\n", b64(k), b64(env[k]))
		}
		return b.String()
	}
	return Language{
		Start: func(ctx context.Context, spec jupyter.Spec) (kernel, error) {
			encode := func(id, code string) []byte { return []byte(id + " " + b64(code)) }
			return startRunner(ctx, spec, runnerSpec{name: "the java runner", file: "JavaRunner.java", body: javaRunner,
				// java.base opened to the runner: it changes the JVM's environment maps.
				argv: []string{java, "--add-modules", "jdk.jshell", "--add-opens", "java.base/java.util=ALL-UNNAMED",
					"--add-opens", "java.base/java.lang=ALL-UNNAMED", "-XX:+UseSerialGC"},
				lang: "java", encode: encode})
		},
		SetEnv: func(e map[string]string) (string, string) {
			return env(true, e), "//vmon-env\nrestore\n"
		},
		ExportEnv: func(e map[string]string) string { return env(false, e) },
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
