package firewall

import (
	"slices"
	"strings"
)

// savedTable is one table of iptables-save output.
type savedTable struct {
	name   string
	chains []string // every chain declared, built-in or not
	rules  []string // "-A CHAIN ..." lines as printed, so they can be replayed as "-D CHAIN ..."
}

// parseSave reads iptables-save output.
func parseSave(out string) []savedTable {
	var tables []savedTable
	var cur *savedTable
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "*"):
			tables = append(tables, savedTable{name: line[1:]})
			cur = &tables[len(tables)-1]
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				cur.chains = append(cur.chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			cur.rules = append(cur.rules, line)
		case line == "COMMIT":
			cur = nil
		}
	}
	return tables
}

// splitArgs splits a saved rule into arguments, honouring the double quotes iptables-save puts
// around arguments with spaces (comments).
func splitArgs(s string) []string {
	var args []string
	var b strings.Builder
	inQuote, escaped, have := false, false, false
	for _, r := range s {
		switch {
		case escaped:
			b.WriteRune(r)
			escaped = false
		case r == '\\' && inQuote:
			escaped = true
		case r == '"':
			inQuote = !inQuote
			have = true
		case r == ' ' && !inQuote:
			if have {
				args = append(args, b.String())
				b.Reset()
				have = false
			}
		default:
			b.WriteRune(r)
			have = true
		}
	}
	if have {
		args = append(args, b.String())
	}
	return args
}

// ruleOwner returns the link index a saved built-in-chain rule belongs to: it must carry our
// comment and name one of our links (-i/-o) or jump to one of our chains. Rules of other
// software, and our rules of another prefix, are never ours.
func (n names) ruleOwner(args []string) (int, bool) {
	tagged := false
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--comment" && args[i+1] == Comment {
			tagged = true
		}
	}
	if !tagged {
		return 0, false
	}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-i", "-o", "--in-interface", "--out-interface":
			if idx, ok := n.ownIface(args[i+1]); ok {
				return idx, true
			}
		case "-j", "-g", "--jump", "--goto":
			if idx, ok := n.ownChain(args[i+1]); ok {
				return idx, true
			}
		}
	}
	return 0, false
}

// renderRemove builds the deletion of every rule and chain of the links match selects, from a
// snapshot of the table: our rules in built-in chains are deleted by their exact saved spec,
// then our chains are flushed and deleted. Only what exists is named, so removing a link that
// is half installed, or already gone, is not an error. It returns "" when nothing matches.
func renderRemove(n names, tables []savedTable, match func(int) bool) (string, []int) {
	var s script
	var removed []int
	note := func(i int) {
		if !slices.Contains(removed, i) {
			removed = append(removed, i)
		}
	}
	for _, t := range tables {
		var dels, chains []string
		for _, c := range t.chains {
			if i, ok := n.ownChain(c); ok && match(i) {
				chains = append(chains, c)
				note(i)
			}
		}
		for _, r := range t.rules {
			args := splitArgs(r)
			if len(args) < 2 {
				continue
			}
			if _, own := n.ownChain(args[1]); own {
				continue // flushed with its chain below
			}
			if i, ok := n.ruleOwner(args); ok && match(i) {
				dels = append(dels, "-D"+r[len("-A"):])
				note(i)
			}
		}
		if len(dels)+len(chains) == 0 {
			continue
		}
		s.begin(t.name)
		for _, d := range dels {
			s.line("%s", d)
		}
		for _, c := range chains {
			s.line("-F %s", c)
		}
		for _, c := range chains {
			s.line("-X %s", c)
		}
	}
	slices.Sort(removed)
	if len(removed) == 0 {
		return "", nil
	}
	return s.String(), removed
}

// globalDeletes returns "-D" lines for the node-wide rules present in the saved filter table:
// tagged with our comment and naming the link wildcard (vmon+) as -i or -o.
func globalDeletes(n names, tables []savedTable) []string {
	all := n.prefix + "+"
	var out []string
	for _, t := range tables {
		if t.name != "filter" {
			continue
		}
		for _, r := range t.rules {
			args := splitArgs(r)
			tagged, wildcard := false, false
			for i := 0; i+1 < len(args); i++ {
				switch {
				case args[i] == "--comment" && args[i+1] == Comment:
					tagged = true
				case (args[i] == "-i" || args[i] == "-o") && args[i+1] == all:
					wildcard = true
				}
			}
			if tagged && wildcard {
				out = append(out, "-D"+r[len("-A"):])
			}
		}
	}
	return out
}

// hasChain reports whether the saved table declares chain.
func hasChain(tables []savedTable, table, chain string) bool {
	for _, t := range tables {
		if t.name == table && slices.Contains(t.chains, chain) {
			return true
		}
	}
	return false
}

// hasOwnChain reports whether the saved table declares any per-link chain of ours.
func hasOwnChain(n names, tables []savedTable, table string) bool {
	for _, t := range tables {
		if t.name != table {
			continue
		}
		for _, c := range t.chains {
			if _, ok := n.ownChain(c); ok {
				return true
			}
		}
	}
	return false
}

// renderMigrate rewrites, for the kept links, proxy-slot jumps installed by an older vmon, which
// matched TCP (to ports 80 and 443 only, at first): a SOCKS5 egress proxy needs every TCP flow of
// the link in the slot and the filtering resolver its DNS, and a link adopted after an upgrade
// must not let them leave unproxied. It returns "" when there is nothing to migrate.
func renderMigrate(n names, tables []savedTable, keep func(int) bool) string {
	var s script
	for _, t := range tables {
		if t.name != "nat" {
			continue
		}
		for _, r := range t.rules {
			args := splitArgs(r)
			if len(args) < 2 || args[1] != "PREROUTING" {
				continue
			}
			i, ok := n.ruleOwner(args)
			if !ok || !keep(i) || !slices.Contains(args, n.chainName(chainProxy, i)) {
				continue
			}
			if r == "-A PREROUTING "+proxyJump(n, i) {
				continue // current
			}
			if s.table == "" {
				s.begin("nat")
			}
			s.line("-D%s", r[len("-A"):])
			s.insertTop("PREROUTING", proxyJump(n, i))
		}
	}
	return s.String()
}
