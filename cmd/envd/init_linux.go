package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// runInit starts the server as a child (same binary, same flags, --init=false) and reaps zombies
// until that child exits; it returns the child's exit code.
func runInit(log *slog.Logger, args []string) (int, error) {
	if os.Getpid() != 1 {
		// Not PID 1 (e.g. --init under another init): a subreaper still gets the orphans.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return 0, fmt.Errorf("become subreaper: %w", err)
		}
	}
	// Subscribe before starting the child so no SIGCHLD or forwarded signal is missed.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	argv := append([]string{os.Args[0]}, slices.Clone(args)...)
	argv = append(argv, "--init=false")
	child, err := os.StartProcess("/proc/self/exe", argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		return 0, fmt.Errorf("start server child: %w", err)
	}
	log.Info("init: server child started", "pid", child.Pid)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			// The child shuts down gracefully and its exit ends init.
			_ = child.Signal(sig)
			continue
		}
		// SIGCHLDs coalesce: reap everything that has exited.
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid == child.Pid {
				code := ws.ExitStatus()
				if ws.Signaled() {
					code = 128 + int(ws.Signal())
				}
				log.Info("init: server child exited", "code", code)
				return code, nil
			}
		}
	}
	return 1, nil
}
