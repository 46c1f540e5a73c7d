// Command envd is vmon's in-sandbox agent, wire-compatible with E2B's envd 0.6.13 as the e2b SDKs
// use it. It serves its API over the agent channel (a unix socket the node bind-mounts into the
// sandbox's init as a descriptor, see internal/agentproto) and, for tests and debugging, on an
// optional TCP address. `envd handoff` is the helper the node runs in a sandbox to hand a running
// envd a new control socket.
//
// As PID 1 (or with --init) it is also the sandbox's init, in the same process: it reaps every
// zombie nobody waits for, including orphaned background processes the kernel reparents to PID 1,
// while the processes it started stay for their own waiters (internal/envd/reaper). One process
// instead of an init plus a server child saves a Go start-up on every sandbox boot.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/channel"
	"github.com/vibemon/vmon/internal/envd/journal"
	"github.com/vibemon/vmon/internal/envd/limitwatch"
	"github.com/vibemon/vmon/internal/envd/oomkill"
	"github.com/vibemon/vmon/internal/envd/process"
	"github.com/vibemon/vmon/internal/envd/reaper"
	"github.com/vibemon/vmon/internal/envd/server"
	"github.com/vibemon/vmon/internal/envd/tasklimit"
	"github.com/vibemon/vmon/internal/guestnet"
	"golang.org/x/sys/unix"
)

type config struct {
	socket       string
	agentFD      int
	listen       string
	initMode     bool
	setClock     bool
	configureNet bool
	maxTasks     int
	oomKill      bool
	logLevel     slog.Level
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "handoff" {
		return handoff(args[1:])
	}
	var cfg config
	fl := flag.NewFlagSet("envd", flag.ContinueOnError)
	fl.StringVar(&cfg.socket, "agent-socket", agentproto.GuestSocket, "unix socket of the node's agent channel, dialled when there is no --agent-fd (empty: no channel)")
	fl.IntVar(&cfg.agentFD, "agent-fd", 0, "descriptor of the agent channel's control socket the node passed (0: none; dial --agent-socket instead)")
	fl.StringVar(&cfg.listen, "listen", "", "also serve the API on this TCP address, e.g. 127.0.0.1:49983 (tests, debugging)")
	fl.BoolVar(&cfg.initMode, "init", false, "also act as init: reap orphaned zombies (implied when PID 1)")
	fl.BoolVar(&cfg.setClock, "set-clock", true, "let POST /init set the system clock from its timestamp")
	fl.BoolVar(&cfg.configureNet, "configure-network", true, "let POST /init configure the guest's interface, address and default route (vmonNetwork)")
	fl.IntVar(&cfg.maxTasks, "max-tasks", 0, "cap the guest's processes and threads at this number (pids controller of envd's cgroup; 0: no cap)")
	fl.BoolVar(&cfg.oomKill, "oom-kill", true, "as init, kill the process with the most memory when the guest runs out of it (gVisor has no OOM killer of its own)")
	fl.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level (debug, info, warn, error)")
	version := fl.Bool("version", false, "print the envd protocol version and exit")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Println(agentproto.EnvdVersion)
		return 0
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	if cfg.maxTasks > 0 {
		// Before anything is started, so every guest process is under it. Without it the
		// sandbox still has its host task limit, reaching which stops the whole sandbox.
		if err := tasklimit.Apply(cfg.maxTasks); err != nil {
			log.Error("guest task limit not applied", "max_tasks", cfg.maxTasks, "err", err)
		}
	}
	jr := journal.New()
	var starter process.Starter
	var guest *reaper.Reaper
	var memHint *oomkill.Hint
	if cfg.initMode || os.Getpid() == 1 {
		r, err := reaper.New(log)
		if err != nil {
			log.Error("init failed", "err", err)
			return 1
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		starter = r
		guest = r
		if cfg.oomKill {
			memHint = oomkill.NewHint()
			opts := oomkill.Options{Log: log.With("component", "oomkill"), Hint: memHint, Guest: r, OnKill: func(p oomkill.Proc, m oomkill.Memory) {
				jr.Add("error", journal.LimitsLogger, fmt.Sprintf("out of memory: killed process %d (%s), which held %d MiB of the sandbox's %d MiB", p.PID, p.Comm, p.RSS>>20, m.Total>>20),
					map[string]string{"reason": "oom-kill", "pid": strconv.Itoa(p.PID), "comm": p.Comm, "rssBytes": strconv.FormatUint(p.RSS, 10), "totalBytes": strconv.FormatUint(m.Total, 10)})
			}}
			if f, err := tasklimit.CurrentFile(); err == nil {
				opts.TasksFile = f
			} else {
				log.Warn("out-of-memory killer counts no task cost", "err", err)
			}
			go func() {
				if err := oomkill.Run(ctx, opts); err != nil {
					log.Error("out-of-memory killer stopped", "err", err)
				}
			}()
		}
	}
	if cfg.initMode || os.Getpid() == 1 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		lo := limitOptions(log, jr)
		if guest != nil {
			lo.Guest = guest
		}
		go limitwatch.New(lo).Run(ctx)
	}
	if err := serve(cfg, log, starter, jr, memHint); err != nil {
		log.Error("envd failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the API on the agent channel and/or the TCP listener until SIGTERM or SIGINT.
func serve(cfg config, log *slog.Logger, starter process.Starter, jr *journal.Journal, memHint *oomkill.Hint) error {
	if cfg.socket == "" && cfg.agentFD <= 0 && cfg.listen == "" {
		return errors.New("nothing to serve: set --agent-fd, --agent-socket and/or --listen")
	}
	var control *agentctl.Conn
	if cfg.agentFD > 0 {
		c, err := agentctl.FromFile(os.NewFile(uintptr(cfg.agentFD), "agent-control"))
		if err != nil {
			// The node may still hand one over (envd handoff); serving on without is better
			// than an init that exits and takes the sandbox with it.
			log.Error("the agent control socket passed is not usable", "fd", cfg.agentFD, "err", err)
		}
		control = c
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	opts := server.Options{Logger: log, SetClock: cfg.setClock, Starter: starter, Journal: jr}
	if memHint != nil {
		opts.MemoryHint = memHint.SetNear
	}
	if cfg.configureNet {
		opts.ConfigureNetwork = guestnet.Apply
	}
	srv, err := server.New(opts)
	if err != nil {
		return fmt.Errorf("create server: %w", err)
	}
	defer srv.Close()
	log.Info("envd starting", "version", agentproto.EnvdVersion, "agent_fd", cfg.agentFD, "socket", cfg.socket, "listen", cfg.listen, "pid", os.Getpid())

	var wg sync.WaitGroup
	errc := make(chan error, 1)
	if cfg.listen != "" {
		ln, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", cfg.listen, err)
		}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s: %w", cfg.listen, err)
			}
		}()
		context.AfterFunc(ctx, func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		})
	}
	switch {
	case cfg.agentFD > 0:
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := channel.RunControl(ctx, channel.ControlOptions{Logger: log, Control: control, Handler: srv}); err != nil {
				errc <- err
			}
		}()
	case cfg.socket != "":
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = channel.Run(ctx, channel.Options{Logger: log, Socket: cfg.socket, Handler: srv})
		}()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
		stop()
	}
	wg.Wait()
	log.Info("envd stopped")
	return err
}

// handoff hands the control socket this process got as a descriptor to the running envd (the
// node runs it with the socket after it restarted, when the first one's host end is gone).
func handoff(args []string) int {
	fl := flag.NewFlagSet("envd handoff", flag.ContinueOnError)
	fd := fl.Int("fd", 3, "descriptor of the control socket to hand over")
	socket := fl.String("socket", agentproto.HandoffSocket, "envd's handoff socket")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	f := os.NewFile(uintptr(*fd), "agent-control")
	if f == nil {
		fmt.Fprintf(os.Stderr, "envd handoff: no descriptor %d\n", *fd)
		return 1
	}
	if err := agentctl.Handoff(*socket, f); err != nil {
		fmt.Fprintln(os.Stderr, "envd handoff:", err)
		return 1
	}
	return 0
}

// limitOptions watches the guest's task limit (envd's pids cgroup), unprivileged users'
// RLIMIT_NPROC (envd's own, which the runtime set for every guest process) and the root disk.
func limitOptions(log *slog.Logger, jr *journal.Journal) limitwatch.Options {
	o := limitwatch.Options{Report: func(level, msg string, f map[string]string) {
		jr.Add(level, journal.LimitsLogger, msg, f)
	}}
	if dir, err := tasklimit.Dir(); err == nil {
		o.TasksDir = dir
	} else {
		log.Warn("the task limit is not watched", "err", err)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(unix.RLIMIT_NPROC, &rl); err == nil && rl.Cur != unix.RLIM_INFINITY && rl.Cur < 1<<31 {
		o.NProc = int(rl.Cur)
	}
	return o
}
