package netpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	mdnetlink "github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/firewall"
	"github.com/vibemon/vmon/internal/guestnet"
	"github.com/vibemon/vmon/internal/netns"
)

// peerName is the guest's interface inside the sandbox namespace.
const peerName = GuestInterface

// New returns a pool for cfg. Nothing is created until Recover.
func New(ctx context.Context, cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	fw, err := firewall.New(firewall.Config{
		Prefix: cfg.LinkPrefix, Env: cfg.Env, NetNS: cfg.HostNetNS, Tools: cfg.Tools, Log: cfg.Log,
		ProxyPort: cfg.ProxyPort, DNSPort: cfg.DNSPort, LogGroup: cfg.LogGroup,
	})
	if err != nil {
		return nil, err
	}
	sys := &linuxSystem{
		pool: cfg.Prefix, kind: cfg.Kind, uid: cfg.VMMUser, gid: cfg.VMMGroup,
		names: names{link: cfg.LinkPrefix, scope: cfg.NetNSScope}, hostNS: cfg.HostNetNS, fw: fw,
	}
	return newPool(cfg, sys), nil
}

type linuxSystem struct {
	pool     netip.Prefix
	kind     Kind
	uid, gid uint32
	names    names
	hostNS   string
	fw       *firewall.Firewall
}

// inHost runs fn on a thread in the host namespace (for /proc/sys, which follows the calling
// thread's namespace, and TAP creation, which happens in it).
func (s *linuxSystem) inHost(fn func() error) error {
	if s.hostNS == "" {
		return fn()
	}
	return netns.Do(s.hostNS, fn)
}

// handle opens a netlink handle in the namespace at path ("" = the process's own).
func handle(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle()
	}
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}

func (s *linuxSystem) fwLink(lease Lease, unrestricted bool) firewall.Link {
	return firewall.Link{Index: lease.Index, Guest: lease.Guest, Pool: s.pool, Unrestricted: unrestricted}
}

func (s *linuxSystem) create(ctx context.Context, lease Lease, unrestricted bool) (l *Link, err error) {
	i := lease.Index
	l = &Link{lease: lease, name: s.names.linkName(i), unrestricted: unrestricted}
	// Whatever a failure leaves half made goes with the lease.
	defer func() {
		if err != nil {
			if derr := s.destroy(context.WithoutCancel(ctx), i); derr != nil {
				err = errors.Join(err, fmt.Errorf("roll back: %w", derr))
			}
			l = nil
		}
	}()
	h, err := handle(s.hostNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()

	if s.kind == TAP {
		err = s.inHost(func() error {
			// /dev/net/tun creates the device in the calling thread's namespace; the handle
			// must live there too, or its index lookup looks in the wrong place.
			th, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer th.Close()
			return th.LinkAdd(&netlink.Tuntap{
				LinkAttrs: netlink.LinkAttrs{Name: l.name},
				Mode:      netlink.TUNTAP_MODE_TAP,
				Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
				Owner:     s.uid,
				Group:     s.gid,
			})
		})
		if err != nil {
			return nil, fmt.Errorf("create tap %s: %w", l.name, err)
		}
	} else {
		if l.nsPath, err = netns.Create(ctx, s.names.nsName(i)); err != nil {
			return nil, err
		}
		ns, err := vnetns.GetFromPath(l.nsPath)
		if err != nil {
			return nil, fmt.Errorf("open namespace %s: %w", l.nsPath, err)
		}
		err = h.LinkAdd(&netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: l.name},
			PeerName:      peerName,
			PeerNamespace: netlink.NsFd(int(ns)),
		})
		ns.Close()
		if err != nil {
			return nil, fmt.Errorf("create veth %s: %w", l.name, err)
		}
	}
	// Rules (with closed policy chains) go in before the link is up, so there is no moment
	// in which a guest could send through an unguarded link.
	fh, err := s.fw.Install(ctx, s.fwLink(lease, unrestricted))
	if err != nil {
		return nil, err
	}
	if !unrestricted {
		l.hooks = fh
	}
	if err := s.configureHost(h, l); err != nil {
		return nil, err
	}
	if err := s.prepare(ctx, l); err != nil {
		return nil, err
	}
	return l, nil
}

func (s *linuxSystem) configureHost(h *netlink.Handle, l *Link) error {
	link, err := h.LinkByName(l.name)
	if err != nil {
		return fmt.Errorf("find %s: %w", l.name, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(l.lease.Host, 30))}
	if err := h.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", l.lease.Host, l.name, err)
	}
	err = s.inHost(func() error {
		// Guests have no IPv6 today; a link-local address would only invite the guest to
		// talk to the host. Best effort, as the seed says: some kernels lack the knob.
		_ = os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", l.name, "disable_ipv6"), []byte("1"), 0o644)
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("enable ip forwarding: %w", err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", l.name, err)
	}
	return nil
}

// guestPlaceholder is the only IPv4 address the sandbox end holds before a runtime boots. runsc
// adopts only interfaces that carry an address (and takes every address it finds over into the
// sandbox); the guest's real address comes later, pushed to envd over the agent channel (seed
// 000: guests run no DHCP client), and the push removes the placeholder. A link-local /32 routes
// nowhere, and the host end drops anything not sourced from the lease.
var guestPlaceholder = netip.MustParsePrefix("169.254.0.2/32")

// prepare readies the peer inside the sandbox namespace for the next runtime: up, with lo up, the
// placeholder as its only IPv4 address and no routes beyond it, whatever an earlier guest left.
func (s *linuxSystem) prepare(ctx context.Context, l *Link) error {
	if l.nsPath == "" {
		return nil // TAP: the VM's NIC is the guest's; it too is configured over the agent channel
	}
	h, err := handle(l.nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	peer, err := h.LinkByName(peerName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", peerName, l.nsPath, err)
	}
	if err := guestnet.PruneIPv4(h, peer, guestPlaceholder); err != nil {
		return fmt.Errorf("in %s: %w", l.nsPath, err)
	}
	if err := h.AddrReplace(peer, &netlink.Addr{IPNet: ipNet(guestPlaceholder)}); err != nil {
		return fmt.Errorf("placeholder address on %s: %w", peerName, err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		return fmt.Errorf("set %s up: %w", peerName, err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	return nil
}

func (s *linuxSystem) reset(ctx context.Context, l *Link) error {
	if l.hooks != nil {
		if err := l.hooks.Detach(ctx); err != nil {
			return err
		}
	}
	if err := s.flushConntrack(l.lease.Mark()); err != nil {
		return err
	}
	return s.prepare(ctx, l)
}

func (s *linuxSystem) adopt(ctx context.Context, lease Lease) (*Link, error) {
	l := &Link{lease: lease, name: s.names.linkName(lease.Index)}
	h, err := handle(s.hostNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if _, err := h.LinkByName(l.name); err != nil {
		return nil, errdefs.Wrap(errdefs.KindNotFound, err, "sandbox link %s is gone", l.name)
	}
	if s.kind == Veth {
		l.nsPath = netns.Path(s.names.nsName(lease.Index))
		if _, err := os.Stat(l.nsPath); err != nil {
			return nil, errdefs.Wrap(errdefs.KindNotFound, err, "namespace of sandbox link %s is gone", l.name)
		}
	}
	fh, err := s.fw.Adopt(s.fwLink(lease, false))
	if err != nil {
		return nil, err
	}
	l.hooks = fh
	return l, nil
}

func (s *linuxSystem) destroy(ctx context.Context, i int) error {
	var errs []error
	h, err := handle(s.hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	name := s.names.linkName(i)
	if link, err := h.LinkByName(name); err == nil {
		if err := h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	} else if !isNotFound(err) {
		errs = append(errs, fmt.Errorf("find %s: %w", name, err))
	}
	// Deleting the namespace also destroys the peer, if the veth was half made.
	if err := netns.Delete(ctx, s.names.nsName(i)); err != nil {
		errs = append(errs, err)
	}
	if err := s.fw.Remove(ctx, i); err != nil {
		errs = append(errs, err)
	}
	// Last, once nothing can create new entries with this mark.
	if err := s.flushConntrack(uint32(i) + 1); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func (s *linuxSystem) existing(ctx context.Context) ([]int, error) {
	seen := map[int]bool{}
	h, err := handle(s.hostNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if i, ok := s.fw.OwnIface(l.Attrs().Name); ok {
			seen[i] = true
		}
	}
	ents, err := os.ReadDir(netns.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", netns.Dir, err)
	}
	for _, e := range ents {
		digits, ok := strings.CutPrefix(e.Name(), s.names.nsPrefix())
		if !ok {
			continue
		}
		if i, err := strconv.Atoi(digits); err == nil && i >= 0 && strconv.Itoa(i) == digits {
			seen[i] = true
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	return out, nil
}

func (s *linuxSystem) sweep(ctx context.Context, keep func(int) bool) error {
	removed, err := s.fw.Sweep(ctx, keep)
	for _, i := range removed {
		// Rules without a device: their conntrack entries are as orphaned as they were.
		err = errors.Join(err, s.flushConntrack(uint32(i)+1))
	}
	// Recovered links rely on the node-wide rules (return traffic, host isolation) even if
	// no new link is ever installed; rewrite them in this version's form.
	return errors.Join(err, s.fw.EnsureGlobal(ctx))
}

func (s *linuxSystem) close(ctx context.Context, last bool) error {
	s.fw.Close()
	if last {
		return s.fw.RemoveGlobal(ctx)
	}
	return nil
}

// flushConntrack deletes every conntrack entry carrying mark, IPv4 and IPv6, in one filtered
// ctnetlink delete (Linux 5.3+), so no NAT mapping or UDP state of a previous sandbox leaks to
// the next one on the same address.
func (s *linuxSystem) flushConntrack(mark uint32) error {
	c, err := dialConntrack(s.hostNS)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.FlushFilter(conntrack.NewFilter().Mark(mark)); err != nil {
		return fmt.Errorf("flush conntrack entries of mark %d: %w", mark, err)
	}
	return nil
}

// dialConntrack opens a ctnetlink socket in the namespace at path ("" = the process's own).
func dialConntrack(path string) (*conntrack.Conn, error) {
	cfg := &mdnetlink.Config{}
	if path != "" {
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("open namespace %s: %w", path, err)
		}
		defer ns.Close()
		cfg.NetNS = int(ns)
	}
	c, err := conntrack.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("ctnetlink: %w", err)
	}
	return c, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}
