package firewall

import (
	"bytes"
	"context"
	"fmt"
	"github.com/vibemon/vmon/internal/netns"
	"os/exec"
	"strings"
)

// execRunner runs iptables-restore/-save, inside netns when set.
type execRunner struct {
	netns string
	tools Tools
}

func newRunner(netns string, tools Tools) (runner, error) {
	return &execRunner{netns: netns, tools: tools}, nil
}

func (r *execRunner) restore(ctx context.Context, f family, script string) error {
	bin := r.tools.Restore4
	if f == v6 {
		bin = r.tools.Restore6
	}
	// -w waits for the xtables lock under the legacy backend instead of failing; --noflush
	// keeps every rule the transaction does not name.
	if _, err := r.exec(ctx, script, bin, "-w", "--noflush"); err != nil {
		return &restoreError{bin: bin, err: err, script: script}
	}
	return nil
}

func (r *execRunner) save(ctx context.Context, f family) (string, error) {
	bin := r.tools.Save4
	if f == v6 {
		bin = r.tools.Save6
	}
	out, err := r.exec(ctx, "", bin)
	if err != nil {
		return "", fmt.Errorf("%s: %w", bin, err)
	}
	return out, nil
}

func (r *execRunner) exec(ctx context.Context, stdin, bin string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	run := func() error {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	}
	var err error
	if r.netns == "" {
		err = run()
	} else {
		err = netns.Do(r.netns, run)
	}
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, msg)
		}
		return "", err
	}
	return stdout.String(), nil
}
