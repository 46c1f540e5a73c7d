// Package helm checks vmon's Helm chart (vmon/): it renders for each of its values files with
// Helm's own SDK, every object it renders decodes strictly into its Kubernetes API type, every
// vmon setting it makes is a flag of the vmon it deploys, and the node DaemonSet grants what
// `vmon doctor` checks a node has. A module of its own, so Helm's and Kubernetes' dependencies stay
// out of vmon's.
package helm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	release "helm.sh/helm/v4/pkg/release/v1"
)

const (
	chartDir  = "vmon"
	namespace = "sandboxes"
	relName   = "vmon"
)

// A store for the chart's own values.yaml, which names none (it is required).
var defaultStore = map[string]any{"store": map[string]any{"url": "s3://vmon-artifacts/cluster"}}

// rendered is what one install renders, by kind and name.
type rendered struct {
	deployments  map[string]*appsv1.Deployment
	daemonSets   map[string]*appsv1.DaemonSet
	services     map[string]*corev1.Service
	secrets      map[string]*corev1.Secret
	claims       map[string]*corev1.PersistentVolumeClaim
	budgets      map[string]*policyv1.PodDisruptionBudget
	ingresses    map[string]*networkingv1.Ingress
	podTemplates map[string]*corev1.PodTemplateSpec
}

// render installs the chart with Helm's client-side dry run (what `helm install --dry-run` and
// `helm template` do) with the values files given (merged in order, then set), and decodes each
// object strictly: a field its type does not have fails.
func render(t *testing.T, files []string, set map[string]any) (*rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vals = merge(vals, v)
	}
	vals = merge(vals, set)
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace = relName, namespace
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("a release of type %T", rel)
	}
	if os.Getenv("VMON_CHART_DUMP") != "" {
		t.Logf("%s\nNOTES:\n%s", r.Manifest, r.Info.Notes)
	}
	if !strings.Contains(r.Info.Notes, "E2B_API_KEY") {
		t.Errorf("the install's notes do not say where the API key is:\n%s", r.Info.Notes)
	}
	return decode(t, r.Manifest), nil
}

// merge is Helm's merge of values files: maps merge key by key, anything else replaces.
func merge(dst, src map[string]any) map[string]any {
	out := make(map[string]any, len(dst))
	for k, v := range dst {
		out[k] = v
	}
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := out[k].(map[string]any); ok {
				out[k] = merge(dm, sm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func decode(t *testing.T, manifest string) *rendered {
	t.Helper()
	r := &rendered{deployments: map[string]*appsv1.Deployment{}, daemonSets: map[string]*appsv1.DaemonSet{},
		services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{}, claims: map[string]*corev1.PersistentVolumeClaim{},
		budgets: map[string]*policyv1.PodDisruptionBudget{}, ingresses: map[string]*networkingv1.Ingress{},
		podTemplates: map[string]*corev1.PodTemplateSpec{}}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		name := head.Metadata.Name
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			r.deployments[name], r.podTemplates["Deployment/"+name], obj = o, &o.Spec.Template, o
		case "apps/v1 DaemonSet":
			o := &appsv1.DaemonSet{}
			r.daemonSets[name], r.podTemplates["DaemonSet/"+name], obj = o, &o.Spec.Template, o
		case "v1 Service":
			o := &corev1.Service{}
			r.services[name], obj = o, o
		case "v1 Secret":
			o := &corev1.Secret{}
			r.secrets[name], obj = o, o
		case "v1 PersistentVolumeClaim":
			o := &corev1.PersistentVolumeClaim{}
			r.claims[name], obj = o, o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			r.budgets[name], obj = o, o
		case "networking.k8s.io/v1 Ingress":
			o := &networkingv1.Ingress{}
			r.ingresses[name], obj = o, o
		default:
			t.Fatalf("the chart renders %s %s %q, which this test does not know: add its type", head.APIVersion, head.Kind, name)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %q does not decode strictly into its API type: %v\n%s", head.Kind, name, err, doc)
		}
		if name == "" || len(name) > 63 {
			t.Errorf("%s %q: a name of 1 to 63 characters", head.Kind, name)
		}
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// vmonFlags are the flags of `vmon serve`, from the vmon this checkout builds: $VMON_BIN (the
// Makefile passes bin/vmon), else one built here.
func vmonFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := os.Getenv("VMON_BIN")
	if bin == "" {
		gobin, err := exec.LookPath("go")
		if err != nil {
			t.Fatalf("no VMON_BIN and no go to build vmon with: %v", err)
		}
		bin = filepath.Join(t.TempDir(), "vmon")
		build := exec.Command(gobin, "build", "-o", bin, "./cmd/vmon")
		build.Dir = filepath.Join("..", "..")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build vmon: %v\n%s", err, out)
		}
	}
	out, err := exec.Command(bin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s serve --help: %v\n%s", bin, err, out)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	for _, f := range []string{"role", "join-token-file", "bootstrap-token-file", "admin-key-file", "drain-on-exit"} {
		if !flags[f] {
			t.Fatalf("%s serve --help has no --%s: is it an old build?\n%s", bin, f, out)
		}
	}
	return flags
}

// otherEnv are the variables the chart sets that are not vmon flags.
var otherEnv = regexp.MustCompile(`^(POD_NAME|POD_IP|HOST_IP|AWS_[A-Z0-9_]+)$`)

func flagOfEnv(name string) (string, bool) {
	f, ok := strings.CutPrefix(name, "VMON_")
	return strings.ToLower(strings.ReplaceAll(f, "_", "-")), ok
}

// checkSettings: every flag in a vmon container's arguments and every VMON_ variable is a flag of
// vmon serve; $(VAR) references name variables set before them (else Kubernetes leaves them as
// they are).
func checkSettings(t *testing.T, where string, c corev1.Container, flags map[string]bool) {
	t.Helper()
	if len(c.Command) != 1 || c.Command[0] != "vmon" || len(c.Args) < 3 || c.Args[0] != "serve" {
		t.Errorf("%s runs %q %q, not vmon serve", where, c.Command, c.Args)
	}
	check := func(flag, as string) {
		if flags[flag] {
			return
		}
		t.Errorf("%s sets %s, but vmon serve has no --%s", where, as, flag)
	}
	for _, a := range c.Args[1:] {
		if f, ok := strings.CutPrefix(a, "--"); ok {
			check(strings.SplitN(f, "=", 2)[0], a)
		}
	}
	defined := map[string]bool{}
	for _, e := range c.Env {
		if f, ok := flagOfEnv(e.Name); ok {
			check(f, e.Name)
		} else if !otherEnv.MatchString(e.Name) {
			t.Errorf("%s sets %s, neither a VMON_ flag nor a known variable", where, e.Name)
		}
		for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				t.Errorf("%s: %s refers to $(%s), which is not set before it", where, e.Name, m[1])
			}
		}
		defined[e.Name] = true
	}
}

func env(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

func envValue(t *testing.T, where string, c corev1.Container, name string) string {
	t.Helper()
	e, ok := env(c, name)
	if !ok || e.ValueFrom != nil {
		t.Fatalf("%s: %s is not set to a value", where, name)
	}
	return e.Value
}

// portOf is the number of c's port named name.
func portOf(c corev1.Container, name string) string {
	for _, p := range c.Ports {
		if p.Name == name {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return "(none named " + name + ")"
}

// checkProbes: readiness on /readyz and liveness on /healthz, on a port the container has.
func checkProbes(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s has no %s probe over HTTP", where, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s's %s probe asks %s, not %s", where, p.name, p.probe.HTTPGet.Path, p.path)
		}
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.probe.HTTPGet.Port.StrVal }) {
			t.Errorf("%s's %s probe is on port %s, which the container does not name", where, p.name, p.probe.HTTPGet.Port.String())
		}
	}
}

// secretMount is the Secret mounted at the directory of path in pod, and the key the file is.
func secretMount(t *testing.T, pod *corev1.PodSpec, c corev1.Container, path string) (secret, key string) {
	t.Helper()
	dir, key := filepath.Dir(path), filepath.Base(path)
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, key
			}
		}
	}
	t.Fatalf("%s: no Secret is mounted at %s", c.Name, dir)
	return "", ""
}

func only[T any](t *testing.T, what string, m map[string]T) (string, T) {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("%d %s rendered, want 1", len(m), what)
	}
	for k, v := range m {
		return k, v
	}
	panic("unreachable")
}

// doctorCapabilities are the capabilities `vmon doctor` checks a node has, read from its source.
func doctorCapabilities(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "internal", "doctor", "doctor.go"))
	if err != nil {
		t.Fatal(err)
	}
	var caps []string
	for _, m := range regexp.MustCompile(`"CAP_([A-Z_]+)"`).FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(caps, m[1]) {
			caps = append(caps, m[1])
		}
	}
	if len(caps) == 0 {
		t.Fatal("internal/doctor names no capability: has its privileges check moved?")
	}
	return caps
}

var (
	pinlessToken = regexp.MustCompile(`^vmonjoin\.[0-9a-f]{8}\.[0-9a-f]{32}$`)
	apiKey       = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)
)

func TestChart(t *testing.T) {
	flags := vmonFlags(t)
	for _, tc := range []struct {
		name  string
		files []string
		set   map[string]any
		ha    bool
	}{
		{"values.yaml", nil, defaultStore, false},
		{"values-small.yaml", []string{"values-small.yaml"}, nil, false},
		{"values-ha.yaml", []string{"values-ha.yaml"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, tc.files, tc.set)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			checkChart(t, r, flags, tc.ha)
		})
	}
}

func checkChart(t *testing.T, r *rendered, flags map[string]bool, ha bool) {
	driverName, driver := only(t, "Deployments", r.deployments)
	nodeName, node := only(t, "DaemonSets", r.daemonSets)
	if len(driver.Spec.Template.Spec.Containers) != 1 || len(node.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("a driver or node pod of more than one container")
	}
	dc, nc := driver.Spec.Template.Spec.Containers[0], node.Spec.Template.Spec.Containers[0]
	checkSettings(t, "the driver", dc, flags)
	checkSettings(t, "the node", nc, flags)
	if !slices.Equal(dc.Args, []string{"serve", "--role", "driver"}) || !slices.Equal(nc.Args, []string{"serve", "--role", "node"}) {
		t.Errorf("roles: driver %q, node %q", dc.Args, nc.Args)
	}
	checkProbes(t, "the driver", dc)
	checkProbes(t, "the node", nc)

	// Every pod template's labels are its controller's selector; every Service selects pods and
	// targets a port they name.
	for name, pt := range r.podTemplates {
		var sel map[string]string
		if d, ok := r.deployments[strings.TrimPrefix(name, "Deployment/")]; ok && strings.HasPrefix(name, "Deployment/") {
			sel = d.Spec.Selector.MatchLabels
		} else {
			sel = r.daemonSets[strings.TrimPrefix(name, "DaemonSet/")].Spec.Selector.MatchLabels
		}
		for k, v := range sel {
			if pt.Labels[k] != v {
				t.Errorf("%s: the selector's %s=%s is not on its pods", name, k, v)
			}
		}
	}
	for name, svc := range r.services {
		for k, v := range svc.Spec.Selector {
			if dc := driver.Spec.Template.Labels[k]; dc != v {
				t.Errorf("Service %s selects %s=%s, which the driver pods do not have", name, k, v)
			}
		}
		for _, p := range svc.Spec.Ports {
			if !slices.ContainsFunc(dc.Ports, func(cp corev1.ContainerPort) bool {
				return cp.Name == p.TargetPort.StrVal && cp.Protocol == p.Protocol
			}) {
				t.Errorf("Service %s targets port %s/%s, which the driver does not name", name, p.TargetPort.String(), p.Protocol)
			}
		}
	}
	gossip, ok := r.services[relName+"-gossip"]
	if !ok || gossip.Spec.ClusterIP != corev1.ClusterIPNone || !gossip.Spec.PublishNotReadyAddresses {
		t.Error("no headless gossip Service that lists members before they are ready")
	}

	// Nodes join at the cluster Service, under the name the drivers' certificate carries (their
	// --advertise), with the token the drivers keep valid.
	join := envValue(t, "the node", nc, "VMON_JOIN")
	if adv := envValue(t, "the driver", dc, "VMON_ADVERTISE"); join != adv {
		t.Errorf("nodes join at %s, the drivers advertise %s (their certificate names that)", join, adv)
	}
	host, port, _ := strings.Cut(join, ":")
	svcName, ok := strings.CutSuffix(host, "."+namespace+".svc")
	if svc, found := r.services[svcName]; !ok || !found || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
		t.Errorf("nodes join at %s, not a port of a Service of the chart", join)
	}
	driverPod, nodePod := &driver.Spec.Template.Spec, &node.Spec.Template.Spec
	tokenSecret, tokenKey := secretMount(t, driverPod, dc, envValue(t, "the driver", dc, "VMON_BOOTSTRAP_TOKEN_FILE"))
	if s, k := secretMount(t, nodePod, nc, envValue(t, "the node", nc, "VMON_JOIN_TOKEN_FILE")); s != tokenSecret || k != tokenKey {
		t.Errorf("nodes join with %s/%s, the drivers keep %s/%s valid", s, k, tokenSecret, tokenKey)
	}
	if sec, ok := r.secrets[tokenSecret]; !ok || !pinlessToken.Match(sec.Data[tokenKey]) {
		t.Errorf("the join token Secret %s: not a token without a pin: %q", tokenSecret, sec.Data[tokenKey])
	}
	keySecret, keyKey := secretMount(t, driverPod, dc, envValue(t, "the driver", dc, "VMON_ADMIN_KEY_FILE"))
	if sec, ok := r.secrets[keySecret]; !ok || !apiKey.Match(sec.Data[keyKey]) {
		t.Errorf("the admin key Secret %s: not an API key: %q", keySecret, sec.Data[keyKey])
	}
	if slices.ContainsFunc(nodePod.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == keySecret }) {
		t.Error("nodes are given the admin key")
	}
	for _, e := range append(slices.Clone(dc.Env), nc.Env...) {
		if e.Name == "VMON_JOIN_TOKEN" || e.Name == "VMON_ADMIN_KEY" {
			t.Errorf("%s is set in the environment: secrets go in mounted files", e.Name)
		}
	}

	checkNode(t, nodeName, nodePod, nc)

	// The store: from a Secret in HA (an S3 bucket and its keys), else a value.
	st, _ := env(dc, "VMON_STORE")
	db, hasDB := env(dc, "VMON_DATABASE")
	pdb, hasPDB := r.budgets[driverName]
	if ha {
		if *driver.Spec.Replicas != 3 {
			t.Errorf("HA: %d driver replicas, want 3", *driver.Spec.Replicas)
		}
		if !hasDB || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil {
			t.Error("HA: the drivers' --database is not from a Secret")
		}
		if st.ValueFrom == nil || st.ValueFrom.SecretKeyRef == nil {
			t.Error("HA: --store is not from a Secret")
		}
		if ns, _ := env(nc, "VMON_STORE"); ns.ValueFrom == nil || ns.ValueFrom.SecretKeyRef == nil || ns.ValueFrom.SecretKeyRef.Name != st.ValueFrom.SecretKeyRef.Name {
			t.Error("HA: the nodes' store is not the drivers'")
		}
		if !hasPDB || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Error("HA: no PodDisruptionBudget keeping all but one driver")
		}
		if len(r.claims) != 0 || driver.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
			t.Error("HA: the drivers hold a claim or are replaced all at once")
		}
		if driver.Spec.Template.Spec.Affinity == nil || driver.Spec.Template.Spec.Affinity.PodAntiAffinity == nil {
			t.Error("HA: the drivers are not spread over machines")
		}
		// The drivers find each other at the headless gossip Service.
		want := fmt.Sprintf("%s-gossip.%s.svc:%s", relName, namespace, portOf(dc, "gossip-tcp"))
		if got := envValue(t, "the driver", dc, "VMON_GOSSIP_JOIN"); got != want {
			t.Errorf("HA: the drivers join the gossip at %q, not the headless Service %s", got, want)
		}
	} else {
		if *driver.Spec.Replicas != 1 || hasDB {
			t.Errorf("SQLite: %d drivers, --database set %v", *driver.Spec.Replicas, hasDB)
		}
		if st.Value == "" {
			t.Error("no --store")
		}
		// SQLite in the data dir: on a claim, and the old pod gone before the new one starts.
		claim, _ := only(t, "claims", r.claims)
		if driver.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Error("a driver on SQLite is replaced with a rolling update: two pods on one data dir")
		}
		if !slices.ContainsFunc(driverPod.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim
		}) {
			t.Errorf("the driver does not mount its claim %s", claim)
		}
	}
	if hasPDB && pdb.Spec.MinAvailable != nil {
		t.Error("a PodDisruptionBudget with minAvailable can block every drain of a one-driver cluster")
	}
	for name, ing := range r.ingresses {
		domain := envValue(t, "the driver", dc, "VMON_DOMAIN")
		var hosts []string
		for _, rule := range ing.Spec.Rules {
			hosts = append(hosts, rule.Host)
			for _, p := range rule.HTTP.Paths {
				if p.Backend.Service == nil || r.services[p.Backend.Service.Name] == nil || p.Backend.Service.Port.Name != "api" {
					t.Errorf("Ingress %s: %s goes elsewhere than the drivers' API", name, rule.Host)
				}
			}
		}
		if !slices.Equal(hosts, []string{"api." + domain, "*." + domain}) {
			t.Errorf("Ingress %s: hosts %q, want api.%s and *.%s", name, hosts, domain, domain)
		}
	}
}

// checkNode: the node DaemonSet grants what `vmon doctor` checks (internal/doctor), and stops
// with a drain its grace period covers.
func checkNode(t *testing.T, name string, pod *corev1.PodSpec, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	privileged := sc != nil && sc.Privileged != nil && *sc.Privileged
	for _, cp := range doctorCapabilities(t) {
		if privileged {
			break
		}
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Add, corev1.Capability(cp)) {
			t.Errorf("node %s lacks CAP_%s, which vmon doctor checks", name, cp)
		}
	}
	if !privileged {
		t.Errorf("node %s is not privileged: loop devices (sandbox disks) and /dev/net/tun need device access no capability gives", name)
	}
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("node %s: hostNetwork %v, dnsPolicy %s (the chart's choice: the machine's network, and the cluster's DNS)", name, pod.HostNetwork, pod.DNSPolicy)
	}
	hostPaths := map[string]string{} // mount path -> host path
	propagation := map[string]corev1.MountPropagationMode{}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				hostPaths[m.MountPath] = v.HostPath.Path
				if m.MountPropagation != nil {
					propagation[m.MountPath] = *m.MountPropagation
				}
			}
		}
	}
	dataDir := envValue(t, "the node", c, "VMON_DATA_DIR")
	for _, want := range []struct{ path, why string }{
		{dataDir, "its data dir (templates, sandboxes' disks, its join credentials)"},
		{"/sys/fs/cgroup", "cgroup v2 (each sandbox's CPU, memory and task limits)"},
		{"/dev", "loop devices made after the pod started (/dev/loop-control) and /dev/net/tun"},
		{"/run/netns", "the sandboxes' network namespaces"},
	} {
		if hostPaths[want.path] != want.path {
			t.Errorf("node %s does not mount the machine's %s at the same path: %s", name, want.path, want.why)
		}
	}
	if propagation[dataDir] != corev1.MountPropagationBidirectional {
		t.Errorf("node %s: the data dir's mounts (overlays, disk images) are not the machine's", name)
	}
	if v, ok := env(c, "VMON_DRAIN_ON_EXIT"); ok && v.Value == "true" {
		d, err := time.ParseDuration(envValue(t, "the node", c, "VMON_DRAIN_TIMEOUT"))
		if err != nil {
			t.Fatal(err)
		}
		// The drain, then putting the snapshots in the store (as long again), then the exit.
		if grace := pod.TerminationGracePeriodSeconds; grace == nil || time.Duration(*grace)*time.Second < 2*d+30*time.Second {
			t.Errorf("node %s: a grace period of %vs does not cover a drain of %s and its snapshots", name, grace, d)
		}
	} else {
		t.Errorf("node %s does not drain on exit", name)
	}
}

// What the chart refuses to render.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		set   map[string]any
		want  string
	}{
		{"no store", nil, nil, "store.url or store.existingSecret is required"},
		{"several drivers on SQLite", nil, merge(defaultStore, map[string]any{"driver": map[string]any{"replicas": 2}}), "needs database.existingSecret"},
		{"an Ingress without a domain", nil, merge(defaultStore, map[string]any{"ingress": map[string]any{"enabled": true}}), "ingress.enabled needs domain"},
		{"a store volume without a claim", []string{"values-small.yaml"}, map[string]any{"store": map[string]any{"volume": map[string]any{"existingClaim": ""}}}, "store.volume.existingClaim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := render(t, tc.files, tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rendered, or failed otherwise: %v", err)
			}
		})
	}
}

// Secrets brought by the operator are used, and none is made.
func TestChartExistingSecrets(t *testing.T) {
	r, err := render(t, nil, merge(defaultStore, map[string]any{"bootstrap": map[string]any{
		"existingTokenSecret": "my-token", "existingAdminKeySecret": "my-key"}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.secrets) != 0 {
		t.Fatalf("Secrets made: %v", keys(r.secrets))
	}
	_, d := only(t, "Deployments", r.deployments)
	var names []string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			names = append(names, v.Secret.SecretName)
		}
	}
	if !slices.Equal(names, []string{"my-token", "my-key"}) {
		t.Fatalf("the driver mounts %q", names)
	}
}

// Two installs make different secrets (an upgrade keeps them: lookup, which a dry run cannot
// show).
func TestChartSecretsAreRandom(t *testing.T) {
	var seen [][]byte
	for range 2 {
		r, err := render(t, nil, defaultStore)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range r.secrets {
			for _, v := range s.Data {
				for _, old := range seen {
					if bytes.Equal(old, v) {
						t.Fatalf("two installs made the same secret %q", v)
					}
				}
				seen = append(seen, v)
			}
		}
	}
	if len(seen) != 4 {
		t.Fatalf("%d secret values in two installs, want 4", len(seen))
	}
}

func keys[T any](m map[string]T) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// secretClients answers the chart's lookups from a fake cluster holding objs.
type secretClients struct {
	client *dynamicfake.FakeDynamicClient
}

func (s secretClients) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looks up %s %s", apiVersion, kind)
	}
	return s.client.Resource(corev1.SchemeGroupVersion.WithResource("secrets")), true, nil
}

// An upgrade keeps the join token and the admin key the install made (lookup finds them).
func TestChartUpgradeKeepsSecrets(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := util.ToRenderValues(ch, defaultStore, common.ReleaseOptions{Name: relName, Namespace: namespace, Revision: 2, IsUpgrade: true},
		common.DefaultCapabilities.Copy())
	if err != nil {
		t.Fatal(err)
	}
	existing := map[string]map[string]string{
		relName + "-join-token": {"token": "vmonjoin.0a1b2c3d.00112233445566778899aabbccddeeff"},
		relName + "-admin-key":  {"key": "e2b_0123456789abcdef0123456789abcdef01234567"},
	}
	var objs []runtime.Object
	for name, data := range existing {
		s := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		objs = append(objs, s)
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	out, err := engine.RenderWithClientProvider(ch, vals, secretClients{dynamicfake.NewSimpleDynamicClient(scheme, objs...)})
	if err != nil {
		t.Fatal(err)
	}
	manifest, ok := out[chartDir+"/templates/secrets.yaml"]
	if !ok {
		t.Fatalf("no secrets.yaml among %v", keys(out))
	}
	r := decode(t, manifest)
	for name, data := range existing {
		for k, v := range data {
			if got := string(r.secrets[name].Data[k]); got != v {
				t.Errorf("the upgrade made %s/%s %q, not the installed %q", name, k, got, v)
			}
		}
	}
}
