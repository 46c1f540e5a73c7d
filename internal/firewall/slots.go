package firewall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Shared slot chains. A link's proxy slot (VMON-T<N>) holds only what is its own — the spoofing
// check — and a jump to a chain holding the policy's REDIRECT block, named by a hash of that
// block and shared by every link whose policy renders the same block. nf_tables re-validates
// every rule reachable from a table's base chains on each commit, but a chain many links jump to
// is validated once, so an attach costs the same with 1 or 500 links of a few policies.
//
// The chains are created on first use, in a transaction of their own under slotMu (so two
// attaches of a new policy never both declare it), and removed in the background once no link
// jumps to them any more (gcSlots).

// slotChain names the shared nat chain of a rendered proxy-slot block, policyChain the shared
// filter chain of a rendered policy block.
func (n names) slotChain(block []string) string { return n.chain + "SLOT-" + blockHash(block) }

func (n names) policyChain(block []string) string { return n.chain + "POL-" + blockHash(block) }

func blockHash(block []string) string {
	sum := sha256.Sum256([]byte(strings.Join(block, "\n")))
	return hex.EncodeToString(sum[:6])
}

// isSlotChain reports a shared chain of either kind.
func (n names) isSlotChain(name string) bool {
	return strings.HasPrefix(name, n.chain+"SLOT-") || strings.HasPrefix(name, n.chain+"POL-")
}

// sharedTable is the table a shared chain lives in.
func (n names) sharedTable(name string) string {
	if strings.HasPrefix(name, n.chain+"POL-") {
		return "filter"
	}
	return "nat"
}

// linkPolicyRules are the rules of a link's policy block that lead into shared chain name: the
// jump, whose chain ends in ACCEPT or returns what it refuses, then a RETURN so the guard
// refuses that and the blocks an update stacked below are never reached.
func linkPolicyRules(name string) []string { return []string{"-j " + name, "-j RETURN"} }

// linkSlotRules are the rules of a link's own slot chain that lead into shared chain name: the
// spoofing check first (the guard drops what it returns), then the jump, then a RETURN so the
// blocks an update stacked below are never reached.
func linkSlotRules(l Link, f family, name string) []string {
	return []string{
		fmt.Sprintf("! -s %s -j RETURN", hostPrefix(l.guest(f), f)),
		"-j " + name,
		"-j RETURN",
	}
}

// createSlot creates shared chain name with block in family f unless this firewall knows it
// exists.
func (fw *Firewall) createSlot(ctx context.Context, f family, name string, block []string) error {
	fw.slotMu.Lock()
	defer fw.slotMu.Unlock()
	if fw.slots[f][name] {
		return nil
	}
	var s script
	s.begin(fw.names.sharedTable(name))
	// Declaring a chain that exists (made by an earlier run) flushes it: it is refilled with the
	// same rules, its name being their hash.
	s.line(":%s - [0:0]", name)
	for _, r := range block {
		s.line("-A %s %s", name, r)
	}
	if err := fw.run.restore(ctx, f, s.String()); err != nil {
		return fmt.Errorf("create shared slot chain %s: %w", name, err)
	}
	if fw.slots[f] == nil {
		fw.slots[f] = map[string]bool{}
	}
	fw.slots[f][name] = true
	return nil
}

// sharedDef is a shared chain a transaction is about to jump to.
type sharedDef struct {
	name  string
	block []string
}

// holdSlots makes sure the shared chains defs (per family) exist, creating them, and returns
// with slotMu read-locked so that the caller's transaction cannot race their removal; the caller
// unlocks.
func (fw *Firewall) holdSlots(ctx context.Context, defs [len(families)][]sharedDef) error {
	for attempt := 0; ; attempt++ {
		for i, f := range families {
			for _, d := range defs[i] {
				if err := fw.createSlot(ctx, f, d.name, d.block); err != nil {
					return err
				}
			}
		}
		fw.slotMu.RLock()
		ok := true
		for i := range families {
			for _, d := range defs[i] {
				ok = ok && fw.slots[i][d.name]
			}
		}
		if ok {
			return nil
		}
		fw.slotMu.RUnlock()
		if attempt == 3 {
			return fmt.Errorf("shared chains keep being removed while attaching")
		}
	}
}

// refSlots counts delta more (or fewer) links whose slot chain jumps to name; a chain nothing
// jumps to any more is removed in the background.
func (fw *Firewall) refSlots(f family, name string, delta int) {
	fw.slotMu.Lock()
	defer fw.slotMu.Unlock()
	if fw.slotRefs[f] == nil {
		fw.slotRefs[f] = map[string]int{}
	}
	fw.slotRefs[f][name] += delta
	if fw.slotRefs[f][name] <= 0 {
		delete(fw.slotRefs[f], name)
		fw.gcSlotsLater()
	}
}

// slotGrace is how long an unused shared chain is kept: a policy's last sandbox is often
// followed by a new one with the same policy, which then finds its chain ready.
var slotGrace = 30 * time.Second

// gcSlotsLater removes, off the request path and after slotGrace, the shared chains no link
// jumps to any more.
func (fw *Firewall) gcSlotsLater() {
	if fw.bg.Err() != nil || !fw.gcPending.CompareAndSwap(false, true) {
		return
	}
	// Not in fw.wg: waiting for compactions must not wait out the grace period.
	fw.gcWG.Go(func() {
		select {
		case <-fw.bg.Done():
			return
		case <-time.After(slotGrace):
		}
		fw.gcPending.Store(false)
		fw.gcSlots(fw.bg)
	})
}

// gcSlots deletes the known shared chains no counted link jumps to. A chain a link this process
// does not count still jumps to (one adopted after a restart, not re-attached yet) is refused by
// the kernel; it stays and is tried again at the next collection.
func (fw *Firewall) gcSlots(ctx context.Context) {
	fw.slotMu.Lock()
	defer fw.slotMu.Unlock()
	for i, f := range families {
		var unused []string
		for name := range fw.slots[i] {
			if fw.slotRefs[i][name] == 0 {
				unused = append(unused, name)
			}
		}
		slices.Sort(unused)
		for _, name := range unused {
			var s script
			s.begin(fw.names.sharedTable(name))
			s.line("-F %s", name)
			s.line("-X %s", name)
			if err := fw.run.restore(ctx, f, s.String()); err != nil {
				fw.log.Debug("shared slot chain still in use", "chain", name, "err", err)
				continue
			}
			delete(fw.slots[i], name)
		}
	}
}

// unusedSlots lists the shared chains of the saved table that no rule jumps to.
func unusedSlots(n names, tables []savedTable, table string) []string {
	var out []string
	for _, t := range tables {
		if t.name != table {
			continue
		}
		used := map[string]bool{}
		for _, r := range t.rules {
			args := splitArgs(r)
			for i := 0; i+1 < len(args); i++ {
				if args[i] == "-j" && n.isSlotChain(args[i+1]) {
					used[args[i+1]] = true
				}
			}
		}
		for _, c := range t.chains {
			if n.isSlotChain(c) && !used[c] {
				out = append(out, c)
			}
		}
	}
	slices.Sort(out)
	return out
}

// knownSlots records the shared chains a saved nat table holds (start-up: chains an earlier run
// made are reused, not redeclared).
func (fw *Firewall) knownSlots(f family, tables []savedTable) {
	fw.slotMu.Lock()
	defer fw.slotMu.Unlock()
	for _, t := range tables {
		for _, c := range t.chains {
			if fw.names.isSlotChain(c) {
				if fw.slots[f] == nil {
					fw.slots[f] = map[string]bool{}
				}
				fw.slots[f][c] = true
			}
		}
	}
}
