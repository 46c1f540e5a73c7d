package codeinterp

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// kernel runs a context's code: a Jupyter kernel, or another runner with the same behaviour.
type kernel interface {
	// Execute runs code, calling emit with each output in order; when ctx ends it interrupts the
	// run and waits for the kernel to settle. A kernel that exits ends it with jupyter.ErrDied.
	Execute(ctx context.Context, code string, silent bool, emit func(jupyter.Output)) (jupyter.Reply, error)
	// ExitErr says how the kernel's process ended, once it has.
	ExitErr() error
	// Shutdown stops the kernel and what it started.
	Shutdown()
}

// softGrace is how long an interrupt asked for in band (awaitCell's soft) has to end the cell
// before the runner gets a signal.
const softGrace = 200 * time.Millisecond

// awaitCell gives a runner's events for one cell to handle until handle reports the cell ended.
// When ctx ends it interrupts the cell once: with soft, when given, and after softGrace with a
// signal to p's process group (a cell that holds the runner's event loop reads nothing); at
// once with the signal without soft. A runner that has not ended the cell within
// jupyter.InterruptGrace after the signal, or whose process exits, ends the wait with
// jupyter.ErrStuck or jupyter.ErrDied.
func awaitCell[E any](ctx context.Context, p *jupyter.Process, runner string, soft func(), events <-chan E, handle func(E) (ended bool)) (interrupted bool, err error) {
	done := ctx.Done()
	var hard, grace <-chan time.Time
	signal := func() {
		_ = p.Interrupt()
		grace = time.After(jupyter.InterruptGrace)
	}
	for {
		select {
		case ev := <-events:
			if handle(ev) {
				return interrupted, nil
			}
		case <-done:
			interrupted, done = true, nil
			if soft == nil {
				signal()
				break
			}
			soft()
			hard = time.After(softGrace)
		case <-hard:
			hard = nil
			signal()
		case <-grace:
			return true, fmt.Errorf("%w (%s)", jupyter.ErrStuck, runner)
		case <-p.Exited():
			return interrupted, fmt.Errorf("%w: %v", jupyter.ErrDied, p.ExitErr())
		}
	}
}

// Language says how to run one language's kernel and speak to it.
type Language struct {
	// Argv starts a Jupyter kernel; "{connection_file}" is replaced by its connection file.
	Argv []string
	// Start, when set, starts a kernel that is not a Jupyter one (spec's Argv is unused).
	Start func(ctx context.Context, spec jupyter.Spec) (kernel, error)
	// Startup is code run once in each new kernel, before Chdir; a kernel whose startup fails
	// still serves (without what the startup adds).
	Startup string
	// Chdir is code that changes the kernel's working directory.
	Chdir func(dir string) string
	// SetEnv is code that sets env for the next execution, and Restore code that puts back what
	// was there before (run after it).
	SetEnv func(env map[string]string) (set, restore string)
	// ExportEnv is code that sets env for good (the sandbox's variables), leaving nothing else
	// behind in the kernel.
	ExportEnv func(env map[string]string) string
}

// lit quotes s as a string literal that Python, R and JavaScript all read the same way.
func lit(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func sortedKeys(env map[string]string) []string {
	return slices.Sorted(maps.Keys(env))
}

// displayPy registers the display formatters behind E2B's data and chart results.
//
//go:embed display.py
var displayPy string

// Python runs ipykernel from python3 (Debian's python3-ipykernel).
func Python(python string) Language {
	return Language{
		Argv: []string{python, "-m", "ipykernel_launcher", "-f", "{connection_file}"},
		// Run in a namespace of its own: the user's globals stay as a fresh kernel's.
		Startup: "exec(compile(" + lit(displayPy) + ", \"vmon-display\", \"exec\"), {\"__name__\": \"__vmon_display__\"})",
		Chdir: func(dir string) string {
			return "import os as __vmon_os\n__vmon_os.chdir(" + lit(dir) + ")\ndel __vmon_os"
		},
		SetEnv: func(env map[string]string) (string, string) {
			keys := make([]string, 0, len(env))
			pairs := make([]string, 0, len(env))
			for _, k := range sortedKeys(env) {
				keys = append(keys, lit(k))
				pairs = append(pairs, lit(k)+": "+lit(env[k]))
			}
			set := "import os as __vmon_os\n" +
				"__vmon_saved = {k: __vmon_os.environ.get(k) for k in [" + strings.Join(keys, ", ") + "]}\n" +
				"__vmon_os.environ.update({" + strings.Join(pairs, ", ") + "})"
			restore := "for __vmon_k, __vmon_v in __vmon_saved.items():\n" +
				"    if __vmon_v is None: __vmon_os.environ.pop(__vmon_k, None)\n" +
				"    else: __vmon_os.environ[__vmon_k] = __vmon_v\n" +
				"del __vmon_saved, __vmon_os"
			return set, restore
		},
		ExportEnv: func(env map[string]string) string {
			pairs := make([]string, 0, len(env))
			for _, k := range sortedKeys(env) {
				pairs = append(pairs, lit(k)+": "+lit(env[k]))
			}
			return "import os as __vmon_os\n__vmon_os.environ.update({" + strings.Join(pairs, ", ") + "})\ndel __vmon_os"
		},
	}
}

// R runs IRkernel (Debian's r-cran-irkernel).
func R(rscript string) Language {
	return Language{
		Argv:  []string{rscript, "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"},
		Chdir: func(dir string) string { return "invisible(setwd(" + lit(dir) + "))" },
		SetEnv: func(env map[string]string) (string, string) {
			keys := make([]string, 0, len(env))
			args := make([]string, 0, len(env))
			for _, k := range sortedKeys(env) {
				keys = append(keys, lit(k))
				args = append(args, fmt.Sprintf("%s = %s", lit(k), lit(env[k])))
			}
			// names = TRUE: R leaves a one-element result unnamed, and restore walks the names.
			set := ".vmon_saved <- Sys.getenv(c(" + strings.Join(keys, ", ") + "), unset = NA, names = TRUE)\n" +
				"invisible(Sys.setenv(" + strings.Join(args, ", ") + "))"
			restore := "for (.vmon_k in names(.vmon_saved)) { if (is.na(.vmon_saved[[.vmon_k]])) Sys.unsetenv(.vmon_k) " +
				"else do.call(Sys.setenv, setNames(list(.vmon_saved[[.vmon_k]]), .vmon_k)) }\n" +
				"rm(.vmon_saved, .vmon_k)"
			return set, restore
		},
		ExportEnv: func(env map[string]string) string {
			args := make([]string, 0, len(env))
			for _, k := range sortedKeys(env) {
				args = append(args, fmt.Sprintf("%s = %s", lit(k), lit(env[k])))
			}
			return "invisible(Sys.setenv(" + strings.Join(args, ", ") + "))"
		},
	}
}

// normalize maps what a client names a language to the name contexts use, as E2B's service
// does: case and surrounding space do not matter, js and ts are short names, empty is python.
func normalize(lang string) string {
	l := strings.ToLower(strings.TrimSpace(lang))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}
